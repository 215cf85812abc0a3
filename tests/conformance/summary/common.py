"""Generic helpers of the summaries: protocol class names, exceptions as data,
enum members by name and the type-strict comparison."""

from __future__ import annotations

import contextlib
import json
from typing import Any

PROTOCOLS = ("chat", "responses", "messages")
REQUEST_CLASS = {
    "chat": "ChatCompletionRequest",
    "responses": "ResponsesRequest",
    "messages": "MessagesRequest",
}
RESPONSE_CLASS = {
    "chat": "ChatCompletionResponse",
    "responses": "ResponsesResponse",
    "messages": "MessagesResponse",
}


def canonical_json(value: Any) -> str:
    """Type-strict text of a summary: tells 1 from 1.0 from True, and keeps key order."""
    return json.dumps(value, ensure_ascii=False, allow_nan=True, default=repr)


def exc_summary(M: Any, exc: BaseException) -> dict:
    """An exception as data: its type name and message (+ status and body for ConversionError)."""
    if isinstance(exc, M.ConversionError):
        body: Any = getattr(exc, "body", None)
        with contextlib.suppress(TypeError, ValueError):
            body = json.loads(body)
        return {
            "error": "ConversionError",
            "status_code": getattr(exc, "status_code", None),
            "body": body,
            "message": str(exc),
        }
    return {"error": type(exc).__name__, "message": str(exc)}


def attempt(M: Any, fn, *args, **kwargs) -> tuple[bool, Any]:
    """(True, result) or (False, exc_summary) for the expected exception kinds."""
    try:
        return True, fn(*args, **kwargs)
    except (
        M.ConversionError,
        ValueError,
        TypeError,
        RuntimeError,
        OverflowError,
        RecursionError,
        UnicodeError,
        KeyError,
    ) as exc:
        return False, exc_summary(M, exc)


def enum_name(cls: Any, value: Any, names: tuple[str, ...]) -> str | None:
    """The attribute name under which `cls` holds `value` (enums compared by name)."""
    if value is None:
        return None
    for name in names:
        member = getattr(cls, name, None)
        if member is not None and (member is value or member == value):
            return name
    return f"<unknown {value!r}>"


MODEL_VERSIONS = ("DeepseekV4Pro", "DeepseekV41Flash")
STAGES = ("ReasoningStart", "ReasoningContinuation", "ContentContinuation")
BEHAVIOURS = ("FillEmpty", "Reject")
WEB_SEARCH = ("Drop", "Reject")
FINISH_REASONS = ("Stop", "Length", "ContentFilter")


def json_text(value: Any) -> str:
    """A JSON-ish property as text that keeps key order and JSON types."""
    return json.dumps(value, ensure_ascii=False, default=repr)


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two summaries first differ (for readable assertion messages)."""
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{path}.{key}: present only in one ({a.get(key)!r} / {b.get(key)!r})"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        if list(a) != list(b):
            return f"{path}: key order {list(a)} != {list(b)}"
        return None
    if isinstance(a, list):
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{index}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        return None
    if a != b or repr(a) != repr(b):
        return f"{path}: {a!r} != {b!r}"
    return None
