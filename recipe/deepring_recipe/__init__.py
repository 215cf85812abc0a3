"""DeepSeek V4 / V4.1 protocol layer: requests to prompts and token ids, model output to events.

A drop-in for the Python API of deepseek-recipe 0.2.0; see recipe/DEVIATIONS.md for where it
differs on purpose.
"""

from ._native import (
    IMAGE_SPECIAL_TOKEN_ID,
    AssistantMessage,
    BytesImageSource,
    Conversation,
    ConversionError,
    DataUrlImageSource,
    DeepseekV4Encoding,
    DeepseekV41Encoding,
    ImageSource,
    LatestReminderMessage,
    Message,
    ModelVersion,
    RenderedPrompt,
    SpecialToken,
    SpecialTokens,
    SystemMessage,
    Tokenizer,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UrlImageSource,
    UserMessage,
    __version__,
)

__all__ = [
    "IMAGE_SPECIAL_TOKEN_ID",
    "AssistantMessage",
    "BytesImageSource",
    "Conversation",
    "ConversionError",
    "DataUrlImageSource",
    "DeepseekV4Encoding",
    "DeepseekV41Encoding",
    "ImageSource",
    "LatestReminderMessage",
    "Message",
    "ModelVersion",
    "RenderedPrompt",
    "SpecialToken",
    "SpecialTokens",
    "SystemMessage",
    "Tokenizer",
    "ToolCall",
    "ToolDefinition",
    "ToolMessage",
    "UrlImageSource",
    "UserMessage",
    "__version__",
]
