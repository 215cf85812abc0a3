"""Chat request bodies to prompt token ids, through the protocol library (never re-implemented
here: rendering rules live in Rust)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

# Model names the engine serves under, accepted in request bodies as the V4.1 prompt format.
ENGINE_MODEL_ALIASES = ("tiny",)


def encode_chat_request(
    body: dict[str, Any] | str | bytes, tokenizer: Any, recipe: ModuleType | None = None
) -> list[int]:
    """Render an OpenAI Chat Completions body as a DeepSeek V4.1 prompt and encode it.

    `tokenizer` is the recipe module's Tokenizer; `recipe` defaults to deepring_recipe (the
    parameter exists so the same glue can be exercised against another implementation).
    Conversion errors (a malformed or unsupported body) are raised as ValueError.
    """
    if recipe is None:
        import deepring_recipe as recipe
    if not hasattr(recipe, "ChatCompletionRequest"):
        raise ValueError(
            "chat request bodies need deepring_recipe's request conversion, which this build "
            "of deepring_recipe does not have yet; pass text or token ids"
        )
    options = recipe.ConversionOptions()
    for name in ENGINE_MODEL_ALIASES:
        options = options.with_model_alias(name, recipe.ModelVersion.DeepseekV41Flash)
    try:
        conv = recipe.ChatCompletionRequest(body).convert(options)
    except recipe.ConversionError as e:
        raise ValueError(f"chat request rejected: {e}") from e
    return list(recipe.DeepseekV41Encoding().with_tokenizer(tokenizer).encode(conv.conversation))
