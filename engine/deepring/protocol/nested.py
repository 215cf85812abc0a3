"""Content inside a request body that serving cannot honour, refused with a 400 naming where it
is, instead of what the official library does with it: images, unless the served model has a
vision encoder (protocol.images), become "[Unsupported Image]" (V4) or image tokens nothing
fills (V4.1); files and documents become "[Unsupported Document]" placeholders; Responses
drops tool kinds and input items it does not know (web_search, file_search, apply_patch,
item_reference, ...).

Cheap for ordinary requests: the body's `type` tags at any depth come with its outline
(protocol.fields); only a body holding a tag outside the API's everyday set is read again, for
the parts that say where the content is. A tag in an unusual place (a tool call's arguments
mentioning "image") costs that second read and is then found harmless.
"""

from __future__ import annotations

from typing import Any

from deepring_recipe import ConversationRequest, request_fields

from deepring.image_spans import NO_VISION
from deepring.protocol.errors import ApiError, field_error

CHAT, RESPONSES, MESSAGES = "chat.completions", "responses", "messages"

# JSON Schema types (tool parameters, response formats) and the thinking switch's values.
_COMMON_TAGS = {
    "object",
    "string",
    "number",
    "integer",
    "boolean",
    "array",
    "null",
    "enabled",
    "disabled",
    "adaptive",
}
# Tags of the content each API serves: a body with no other tag needs no closer look.
_EVERYDAY = {
    CHAT: _COMMON_TAGS | {"text", "function", "json_object", "json_schema", "regex"},
    RESPONSES: _COMMON_TAGS | {
        "message", "function_call", "function_call_output", "reasoning", "reasoning_text",
        "summary_text", "custom_tool_call", "custom_tool_call_output", "input_text",
        "output_text", "function", "custom", "namespace", "text", "json_schema", "json_object",
        "grammar",
    },
    MESSAGES: _COMMON_TAGS | {
        "text", "tool_use", "tool_result", "thinking", "tool_reference", "tool_addition",
        "auto", "any", "tool", "none", "json_schema", "ephemeral",
    },
}  # fmt: skip

# Why images are refused when the caller gives no reason (a served model with a vision
# encoder takes them: protocol.images).
NO_IMAGES = NO_VISION
_NO_FILES = (
    "file input is not supported: the served model reads text only (send the "
    "file's text as text content)"
)

# Responses input items the recipe converts (a message may also come without a type).
_ITEMS = {
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "custom_tool_call",
    "custom_tool_call_output",
}
_RESPONSES_TOOLS = {"function", "custom", "namespace"}


def check(
    api: str, body: Any, conv: ConversationRequest, tags: frozenset[str],
    no_images: str | None = NO_IMAGES,
) -> None:  # fmt: skip
    """Refuse (ApiError 400) the first content of the body that is not served. no_images: why
    images are refused, None when they are served."""
    if tags <= _EVERYDAY[api]:
        return
    if api == CHAT:
        _chat(_read(body, "messages"), no_images)
    elif api == RESPONSES:
        got = request_fields(body, ["input", "tools", "tool_choice"])
        _responses_input(got.get("input"), no_images)
        _responses_tools(got.get("tools"), got.get("tool_choice"))
    else:
        _messages(_read(body, "messages"), no_images)


def _read(body: Any, name: str) -> Any:
    return request_fields(body, [name]).get(name)


def _refuse(where: str, message: str) -> ApiError:
    return field_error(where, f"{where}: {message}", "unsupported_value")


def _parts(content: Any) -> list:
    return content if isinstance(content, list) else []


def _kind(block: Any) -> Any:
    return block.get("type") if isinstance(block, dict) else None


def _chat(messages: Any, no_images: str | None) -> None:
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(m, dict):
            continue
        for j, part in enumerate(_parts(m.get("content"))):
            kind = _kind(part)
            if kind == "image_url" and no_images:
                raise _refuse(f"messages[{i}].content[{j}]", no_images)
            # The official reads a file part's image file_data as an image (and refuses other
            # file data with its own 400): served where images are, refused where not.
            if kind == "file" and no_images:
                raise _refuse(f"messages[{i}].content[{j}]", _NO_FILES)


def _responses_parts(parts: Any, where: str, no_images: str | None) -> None:
    for j, part in enumerate(_parts(parts)):
        kind = _kind(part)
        if kind == "input_image" and no_images:
            raise _refuse(f"{where}[{j}]", no_images)
        if kind == "input_file":
            raise _refuse(f"{where}[{j}]", _NO_FILES)


def _responses_input(items: Any, no_images: str | None) -> None:
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            _responses_parts(item.get("content"), f"input[{i}].content", no_images)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            _responses_parts(item.get("output"), f"input[{i}].output", no_images)
        elif kind == "item_reference":
            raise _refuse(
                f"input[{i}]",
                "item_reference is not supported: no items are stored (send the item itself)",
            )
        elif kind not in _ITEMS:
            raise _refuse(
                f"input[{i}]",
                f"{kind!r} items are not supported (only messages, "
                "reasoning and function or custom tool calls and "
                "their outputs)",
            )


def _responses_tools(tools: Any, choice: Any) -> None:
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = _kind(tool)
        if kind not in _RESPONSES_TOOLS:
            raise _refuse(
                f"tools[{i}]",
                f"{kind!r} tools are not supported (only function, "
                "namespace and custom apply_patch tools)",
            )
    kind = _kind(choice)
    if kind is not None and kind not in ("function", "custom"):
        raise _refuse("tool_choice", f"{kind!r} is not supported (no such tool is served)")


def _messages(messages: Any, no_images: str | None) -> None:
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(m, dict):
            continue
        for j, block in enumerate(_parts(m.get("content"))):
            where = f"messages.{i}.content.{j}"
            _messages_block(block, where, no_images)
            if _kind(block) == "tool_result":
                for k, inner in enumerate(_parts(block.get("content"))):
                    _messages_block(inner, f"{where}.content.{k}", no_images)


def _messages_block(block: Any, where: str, no_images: str | None) -> None:
    kind = _kind(block)
    if kind == "image" and no_images:
        raise ApiError(400, f"{where}: {no_images}")
    if kind == "document":
        raise ApiError(
            400,
            f"{where}: document input is not supported: the served model reads "
            "text only (send the document's text as a text block)",
        )
