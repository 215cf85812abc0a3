"""The annotation tables of the stub.

What comes from the tables below: the annotations. `TYPES` maps class -> member -> annotation (a
string for a property, a dict of parameter name -> annotation plus "return" for a callable;
"{cls}" stands for the class's own name, "*" for every parameter not named). The "*" class holds
members shared by several classes, the "" class module-level functions and constants, and
`PARAMS` parameter names that mean the same thing wherever they occur. A parameter whose default
is `None` gets `| None` added. Anything the tables do not cover is typed `Any` and listed on
stderr, so a new binding still yields a stub that passes stubtest; add it to the tables to type
it. `DOCS` (docs.py) keeps hand-written docstrings for members whose
Rust side has no doc comment (a doc comment on the binding takes precedence).
"""

from __future__ import annotations

from typing import Any

# Private aliases, emitted only when the stub uses them (private names are not checked against
# the runtime by stubtest).
ALIASES: dict[str, str] = {
    "_RequestBody": "bytes | str | dict[str, Any]",
    "_Role": 'Literal["system", "user", "assistant", "tool", "latest_reminder"]',
    "_ToolChoice": 'Literal["auto", "none", "required"]',
    "_ReasoningEffort": 'Literal["low", "high", "xhigh", "max"]',
    "_ResponseFormat": 'Literal["text", "json_object", "json_schema", "regex"]',
    "_ImageDetail": 'Literal["low", "high", "original", "auto"]',
    "_ImageSourceKind": 'Literal["data_url", "url", "bytes"]',
    "_Logprobs": "Sequence[tuple[float, Sequence[tuple[int, float]]]]",
    "_ChunkGenerator": (
        "ChatCompletionChunkGenerator | ResponsesChunkGenerator | MessagesChunkGenerator"
    ),
    "_Event": "ChatCompletionChunk | ResponsesStreamEvent | MessagesStreamEvent",
}

# Parameter names with one meaning across the module.
PARAMS: dict[str, str] = {
    "arguments": "str",
    "body": "_RequestBody",
    "content": "str",
    "context_limit": "int",
    "conversation": "Conversation",
    "created": "int",
    "data": "bytes",
    "data_url": "str",
    "default_thinking_mode": "bool",
    "defer_loading": "bool",
    "description": "str",
    "detail": "_ImageDetail",
    "echo": "ResponsesEcho",
    "finish_reason": "InferenceFinishReason",
    "generator": "_ChunkGenerator",
    "id": "str",
    "ids": "Sequence[int]",
    "image_sources": "Sequence[ImageSource]",
    "image_token": "str",
    "logprobs": "_Logprobs",
    "messages": "Sequence[Message]",
    "messages_web_search": "WebSearchBehavior",
    "model": "str",
    "model_version": "ModelVersion",
    "model_versions_by_name": "dict[str, ModelVersion]",
    "name": "str",
    "namespace_tool_map": "dict[str, tuple[str, str]]",
    "non_thinking_max_tokens_upper_bound": "int",
    "parameters": "Any",
    "parse_json_output": "bool",
    "parse_tool_calls": "bool",
    "path": "str",
    "prefix": "bool",
    "prompt": "str",
    "prompt_cache_hit_tokens": "int",
    "prompt_tokens": "int",
    "prompt_usage": "PromptUsage",
    "reasoning_content": "str",
    "reasoning_content_behavior": "ReasoningContentBehavior",
    "reasoning_effort": "_ReasoningEffort",
    "request": "ConversationRequest",
    "response_format": 'Literal["text", "json_object"]',
    "response_regex": "str",
    "response_schema": "Any",
    "responses_web_search": "WebSearchBehavior",
    "signature": "str",
    "special_ranges": "Sequence[tuple[int, int]]",
    "special_tokens": "SpecialTokens",
    "starts_in_tool_calls": "bool",
    "stop_sequences": "Sequence[str]",
    "strict": "bool",
    "system_fingerprint": "str",
    "text": "str",
    "thinking_initial_stage": "ThinkingInitialStage",
    "thinking_max_tokens_upper_bound": "int",
    "thinking_mode": "bool",
    "threads": "int | None",
    "token_count": "int",
    "token_ids": "Sequence[int]",
    "tokenizer": "Tokenizer",
    "tool_call_id": "str",
    "tool_calls": "Sequence[ToolCall]",
    "tool_choice": "_ToolChoice",
    "tools": "Sequence[ToolDefinition]",
    "url": "str",
}

_RESPONSE = {
    "accumulate": {"return": "None"},
    "to_json": {"return": "str"},
    "sse_event_name": {"return": "str | None"},
    "sse_done_data": {"return": "str | None"},
}
_REQUEST = {"model": "str", "convert": {"options": "ConversionOptions"}}
_MESSAGE = {
    "role": "_Role",
    "content": "str",
    "reasoning_content": "str | None",
    "tool_calls": "list[ToolCall] | None",
    "tool_call_id": "str | None",
    "image_sources": "list[ImageSource]",
    "prefix": "bool",
}

# Class -> member -> annotation. A property is a string, or a (getter, setter value) pair when
# the setter takes a wider type; a callable is a dict of parameter -> annotation and "return".
# Properties are emitted in the order listed here, then alphabetically.
TYPES: dict[str, dict[str, Any]] = {
    "": {
        "decode_rgb": {"data": "bytes", "return": "tuple[int, int, bytes]"},
        "request_fields": {"names": "Sequence[str]", "return": "dict[str, Any]"},
        "request_outline": {
            "names": "Sequence[str]",
            "return": "tuple[list[str], frozenset[str], dict[str, Any]]",
        },
    },
    "*": {
        "convert": {"return": "ConversationRequest"},
        "encode": {"return": "list[int]"},
        "encode_bytes": {"return": "bytes"},
        "model": "str",
        "render_conversation": {"return": "RenderedPrompt"},
        "to_json": {"return": "str"},
        "with_special_tokens": {"return": "{cls}"},
        "with_tokenizer": {"return": "{cls}"},
    },
    # errors, tokens, model versions
    "ConversionError": {"status_code": "int", "body": "str"},
    "SpecialToken": {"default_str": {"return": "str"}},
    "SpecialTokens": {"__new__": {"*": "str"}, "token": {"token": "SpecialToken", "return": "str"}},
    "Tokenizer": {
        "from_file": {"return": "Tokenizer"},
        "from_str": {"return": "Tokenizer"},
        "with_threads": {"return": "Tokenizer"},
        "from_pretrained": {
            "identifier": "str",
            "revision": "str",
            "token": "str",
            "return": "Tokenizer",
        },
        "threads": "int",
        "vocab_size": "int",
        "encode_plain": {"return": "list[int]"},
        "encode_prompt": {"return": "list[int]"},
        "decode": {"return": "str"},
        "token_to_id": {"token": "str", "return": "int | None"},
    },
    # conversations
    "ToolCall": {"id": "str", "name": "str", "arguments": "str"},
    "ToolDefinition": {
        "name": "str",
        "description": "str | None",
        "parameters": "Any",
        "strict": "bool | None",
        "defer_loading": "bool",
    },
    "ImageSource": {
        "kind": "_ImageSourceKind",
        "detail": "_ImageDetail",
        "data_url": "str | None",
        "url": "str | None",
        "data": "bytes | None",
        "path": "str",
    },
    # images
    "ImageError": {"kind": "str", "is_retryable": "bool"},
    "ImageInfo": {
        "data": "bytes",
        "width": "int",
        "height": "int",
        "__new__": {"width": "int", "height": "int"},
    },
    "MultiModalData": {
        "__new__": {"images": "Sequence[ImageInfo]"},
        "images": "list[ImageInfo]",
        "is_empty": {"return": "bool"},
        "image_token_adjustment": {"return": "int"},
    },
    "ImageQuota": {"image_count": {"return": "int"}, "byte_size": {"return": "int"}},
    "PreprocessOptions": {
        "__new__": {"max_dimension_px": "int", "low_detail_max_dimension_px": "int"},
        "detail": "_ImageDetail",
        "max_dimension_px": "int",
        "low_detail_max_dimension_px": "int",
    },
    "ReqwestImageFetcher": {
        "with_max_bytes": {"max_bytes": "int", "return": "ReqwestImageFetcher"},
        "with_destination_filter": {
            "destination_filter": "Callable[[str, str], bool]",
            "return": "ReqwestImageFetcher",
        },
        "fetch": {"return": "bytes"},
    },
    "OpenCvImagePreprocessor": {
        "preprocess": {"options": "PreprocessOptions", "return": "ImageInfo"},
    },
    "ImageResolver": {
        "__new__": {"fetcher": "ReqwestImageFetcher", "preprocessor": "OpenCvImagePreprocessor"},
        "resolve": {
            "sources": "Sequence[ImageSource]",
            "quota": "ImageQuota",
            "return": "MultiModalData",
        },
    },
    # the engine's private kernel (crates/python/src/kernels.rs)
    "_Int8Head": {
        "__new__": {"q": "bytes", "scales": "bytes", "vocab": "int", "k": "int"},
        "ROW_MAX": "int",
        "has_avx2": {"return": "bool"},
        "on_openmp": {"return": "bool"},
        "candidates": {
            "yq": "bytes",
            "rows": "int",
            "x": "bytes",
            "a": "bytes",
            "threads": "int",
            "return": "tuple[bytes, bytes, bytes, bytes, bytes]",
        },
        "logits": {"yq": "bytes", "rows": "int", "x": "bytes", "threads": "int", "return": "bytes"},
    },
    "Message": _MESSAGE,
    "SystemMessage": {"tools": "list[ToolDefinition] | None"},
    "Conversation": {
        "messages": "list[Message]",
        "thinking_mode": "bool",
        "tools": "list[ToolDefinition]",
        "tool_choice": "_ToolChoice",
        "reasoning_effort": "_ReasoningEffort | None",
        "response_format": "_ResponseFormat",
        "response_schema": "Any | None",
        "response_regex": "str | None",
    },
    "RenderedPrompt": {
        "prompt": "str",
        "special_ranges": "list[tuple[int, int]]",
        "image_sources": "list[ImageSource]",
    },
    # options and requests
    "ThinkingInitialStage": {"starts_in_reasoning": {"return": "bool"}},
    "ConversionOptions": {
        "default_thinking_mode": "bool",
        "model_versions_by_name": "dict[str, ModelVersion]",
        "thinking_max_tokens_upper_bound": "int",
        "non_thinking_max_tokens_upper_bound": "int",
        "reasoning_content_behavior": "ReasoningContentBehavior",
        "responses_web_search": "WebSearchBehavior",
        "messages_web_search": "WebSearchBehavior",
        "special_tokens": "SpecialTokens",
        "with_default_thinking_mode": {"return": "ConversionOptions"},
        "with_reasoning_content_behavior": {"return": "ConversionOptions"},
        "with_responses_web_search": {"return": "ConversionOptions"},
        "with_messages_web_search": {"return": "ConversionOptions"},
        "with_model_alias": {"return": "ConversionOptions"},
        "with_model_versions_by_name": {"return": "ConversionOptions"},
        "with_thinking_max_tokens_upper_bound": {"return": "ConversionOptions"},
        "with_non_thinking_max_tokens_upper_bound": {"return": "ConversionOptions"},
    },
    "OutputConstraint": {"kind": "str", "schema": "str"},
    "InferenceOptions": {
        "max_tokens": "int | None",
        "temperature": "float | None",
        "top_p": "float | None",
        "logprobs": "bool",
        "top_logprobs": "int | None",
        "seed": "int | None",
        "output_constraint": "OutputConstraint | None",
    },
    "ParsingOptions": {
        "parse_tool_calls": "bool",
        "starts_in_tool_calls": "bool",
        "parse_json_output": "bool",
        "thinking_initial_stage": "ThinkingInitialStage | None",
        "stop_sequences": ("list[str]", "Sequence[str]"),
        "special_tokens": "SpecialTokens",
    },
    "ConversationRequest": {
        "conversation": "Conversation",
        "inference_options": "InferenceOptions",
        "parsing_options": "ParsingOptions",
        "model_version": "ModelVersion",
        "stream": "bool",
        "resolve_max_tokens": {"return": "int"},
    },
    "ChatCompletionRequest": {
        **_REQUEST,
        "chunk_generator": {"return": "ChatCompletionChunkGenerator"},
    },
    "ResponsesRequest": {
        **_REQUEST,
        "namespace_tool_map": {
            "options": "ConversionOptions",
            "return": "dict[str, tuple[str, str]]",
        },
        "echo": {"return": "ResponsesEcho"},
        "chunk_generator": {"return": "ResponsesChunkGenerator"},
    },
    "MessagesRequest": {**_REQUEST, "chunk_generator": {"return": "MessagesChunkGenerator"}},
    # streaming output
    "PromptUsage": {"prompt_tokens": "int", "prompt_cache_hit_tokens": "int"},
    "InferenceChunk": {
        "ready": {"return": "InferenceChunk"},
        "text": {"return": "InferenceChunk"},
        "tokens": {"return": "InferenceChunk"},
        "finish": {"return": "InferenceChunk"},
        "kind": 'Literal["ready", "text", "tokens", "finish"]',
        "content": "str | None",
        "token_ids": "list[int] | None",
        "finish_reason": "InferenceFinishReason | None",
        "prompt_usage": "PromptUsage | None",
        "token_count": "int | None",
        "system_fingerprint": "str | None",
    },
    "ResponsesChunkGenerator": {
        "with_namespace_tool_map": {"return": "ResponsesChunkGenerator"},
        "with_echo": {"return": "ResponsesChunkGenerator"},
    },
    "ResponsesEcho": {
        "instructions": "str | None",
        "max_output_tokens": "int | None",
        "temperature": "float",
        "top_p": "float",
        "top_logprobs": "int",
        "user": "str | None",
        "with_served": {
            "parallel_tool_calls": "bool",
            "max_tool_calls": "int | None",
            "metadata": "dict[str, str] | None",
            "prompt_cache_key": "str | None",
            "safety_identifier": "str | None",
            "presence_penalty": "float",
            "frequency_penalty": "float",
            "return": "ResponsesEcho",
        },
    },
    "MessagesChunkGenerator": {"with_signature": {"return": "MessagesChunkGenerator"}},
    "StreamProcessor": {
        "__new__": {"options": "ParsingOptions"},
        "finished": "bool",
        "push": {"chunk": "InferenceChunk", "return": "list[_Event]"},
        "finish": {"return": "list[_Event]"},
        "close": {"return": "None"},
    },
    "ChatCompletionResponse": {
        **_RESPONSE,
        "accumulate": {"chunk": "ChatCompletionChunk", "return": "None"},
        "sse_event_name": {"chunk": "ChatCompletionChunk", "return": "str | None"},
    },
    "ResponsesResponse": {
        **_RESPONSE,
        "accumulate": {"chunk": "ResponsesStreamEvent", "return": "None"},
        "sse_event_name": {"chunk": "ResponsesStreamEvent", "return": "str | None"},
    },
    "MessagesResponse": {
        **_RESPONSE,
        "accumulate": {"chunk": "MessagesStreamEvent", "return": "None"},
        "sse_event_name": {"chunk": "MessagesStreamEvent", "return": "str | None"},
    },
}

# Dunder methods worth declaring (the rest are object's); "{cls}" is the class.
DUNDERS: dict[str, str] = {
    "__int__": "def __int__(self) -> int: ...",
    "__index__": "def __index__(self) -> int: ...",
    "__bool__": "def __bool__(self) -> bool: ...",
    "__len__": "def __len__(self) -> int: ...",
    "__eq__": "def __eq__(self, value: object, /) -> bool: ...",
    "__ne__": "def __ne__(self, value: object, /) -> bool: ...",
    "__lt__": "def __lt__(self, value: {cls}, /) -> bool: ...",
    "__le__": "def __le__(self, value: {cls}, /) -> bool: ...",
    "__gt__": "def __gt__(self, value: {cls}, /) -> bool: ...",
    "__ge__": "def __ge__(self, value: {cls}, /) -> bool: ...",
}
# Dunders left out: object's own (stubs inherit them) and what the stub declares otherwise.
SKIP_DUNDERS = {
    "__new__",
    "__init__",
    "__repr__",
    "__str__",
    "__doc__",
    "__module__",
    "__dict__",
    "__weakref__",
    "__hash__",
    "__getattribute__",
    "__setattr__",
    "__delattr__",
    "__reduce__",
    "__reduce_ex__",
    "__getstate__",
    "__setstate__",
    "__sizeof__",
    "__format__",
    "__dir__",
    "__init_subclass__",
    "__subclasshook__",
    "__text_signature__",
}


TYPING_NAMES = ("Any", "ClassVar", "Literal", "TypeAlias", "final")
ABC_NAMES = ("Callable", "Mapping", "Sequence")
