"""Request bodies for a live server: generated bodies pointed at the served model, their
deterministic streamed / non-streamed twins, and the few fixed bodies the dedicated checks
send. Also what a body asks for (tool choice, a JSON schema), which properties read."""

from __future__ import annotations

import copy
import json
from typing import Any

from deepring.conformance.bodies.context import KNOWN_MODELS

MAX_TOKEN_FIELDS = {
    "chat": ("max_tokens", "max_completion_tokens"),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}


def as_dict(body: Any) -> dict | None:
    """A generated body (dict, or its JSON as str / bytes) as a dict; None if it is none."""
    if isinstance(body, dict):
        return body
    try:
        value = json.loads(body)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def point_at(body: Any, model: str) -> Any:
    """The generated body with the strategies' model names replaced by the served model.

    The strategies draw the recipe's own names (valid for the official library) or others to
    be refused; on a live server only its own name is valid, and an "other" name must be one
    no server serves ("gpt-4o" or "deepseek-chat" may well be an alias somewhere), so those
    get a prefix. Kept in the body's encoding (dict, str or bytes)."""
    d = as_dict(body)
    if d is None or "model" not in d:
        return body
    name = d["model"]
    if name in KNOWN_MODELS:
        name = model
    elif isinstance(name, str) and name:
        name = f"no-such-model:{name}"
    else:
        return body
    d = {**d, "model": name}
    if isinstance(body, dict):
        return d
    text = json.dumps(d, ensure_ascii=False)
    return text if isinstance(body, str) else text.encode()


def twin(protocol: str, body: dict, stream: bool, max_tokens: int, seed: int | None) -> dict:
    """The body made deterministic (temperature 0, a seed), its output capped at max_tokens,
    streamed or not (a streamed Chat request asks for usage)."""
    b = copy.deepcopy(body)
    b["temperature"] = 0
    b.pop("top_p", None)  # moot at temperature 0
    if seed is not None:
        b["seed"] = seed
    fields = MAX_TOKEN_FIELDS[protocol]
    given = [b[f] for f in fields if isinstance(b.get(f), int) and not isinstance(b[f], bool)]
    for f in fields:
        b.pop(f, None)
    b[fields[0]] = min([max_tokens, *given])
    b["stream"] = stream
    if protocol == "chat":
        b.pop("stream_options", None)
        if stream:
            b["stream_options"] = {"include_usage": True}
    return b


def text_body(protocol: str, model: str, text: str, max_tokens: int) -> dict:
    """The simplest valid request: one user message."""
    if protocol == "responses":
        return {"model": model, "input": text, "max_output_tokens": max_tokens}
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    }


def tool_names(protocol: str, body: dict) -> set[str]:
    names = set()
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        # Chat nests the function; the others name the tool itself
        name = (tool.get("function") or {}).get("name") if protocol == "chat" else tool.get("name")
        if isinstance(name, str):
            names.add(name)
        for inner in tool.get("tools") or [] if tool.get("type") == "namespace" else []:
            if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                names.add(f"{name}::{inner['name']}")
                names.add(inner["name"])
    return names


def forced_tool(protocol: str, body: dict) -> tuple[str, str | None] | None:
    """("required", None) or ("named", name) when the body forces a tool call."""
    choice = body.get("tool_choice")
    if protocol == "messages":
        if not isinstance(choice, dict):
            return None
        if choice.get("type") == "any":
            return ("required", None)
        if choice.get("type") == "tool":
            return ("named", choice.get("name"))
        return None
    if choice == "required":
        return ("required", None)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name") if protocol == "chat" else None
        return ("named", name or choice.get("name"))
    return None


def json_schema(protocol: str, body: dict) -> dict | bool | None:
    """The JSON schema the output must match, when the body asks for one."""
    if protocol == "chat":
        fmt = body.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            return (fmt.get("json_schema") or {}).get("schema")
    elif protocol == "responses":
        fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            return fmt.get("schema")
    else:
        fmt = body.get("output_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            return fmt.get("schema")
    return None
