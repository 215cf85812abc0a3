"""`tool_choice: allowed_tools` (OpenAI's Chat Completions and Responses): every declared tool
stays in the prompt (so the prompt, and its cached prefix, do not change with the choice), and
the model may call only the listed ones; `mode` is `auto` (text or calls) or `required` (calls).

The recipe's protocol types do not know this form (neither does deepseek-recipe 0.2.0: Chat
fails to parse it, Responses takes it for a hosted tool), so a body that uses it is rewritten
for the recipe with `tool_choice` set to the mode, and the tool
grammar (structured.build.for_request) is given the allowed names: calling any other tool is
not a token the sampler can pick.

Chat:      {"type": "allowed_tools", "allowed_tools": {"mode": M, "tools": [
               {"type": "function", "function": {"name": N}}, ...]}}
Responses: {"type": "allowed_tools", "mode": M, "tools": [{"type": "function", "name": N}, ...]}
           (also {"type": "custom", "name": N} for a custom tool)
"""

from __future__ import annotations

import json
from typing import Any

from deepring.protocol.errors import ApiError, field_error

_MODES = ("auto", "required")


def _bad(message: str) -> ApiError:
    return field_error("tool_choice", f"Invalid 'tool_choice' (allowed_tools): {message}")


def mentioned(body: bytes | str | dict) -> bool:
    """Whether the body may use allowed_tools: a substring search, so that only such bodies
    pay for the JSON parse of `rewrite`."""
    if isinstance(body, dict):
        choice = body.get("tool_choice")
        return isinstance(choice, dict) and choice.get("type") == "allowed_tools"
    return (b"allowed_tools" if isinstance(body, bytes) else "allowed_tools") in body


def rewrite(api: str, body: bytes | str | dict) -> tuple[dict, frozenset[str]] | None:
    """(the body with tool_choice set to the mode, the allowed tool names) when the body's
    tool_choice is allowed_tools; None when it is not (or the body is not a JSON object).
    ApiError (400) for a malformed allowed_tools choice."""
    if isinstance(body, dict):
        obj = body
    else:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return None
    choice = obj.get("tool_choice") if isinstance(obj, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return None
    if api == "chat.completions":
        spec = choice.get("allowed_tools")
        if not isinstance(spec, dict):
            raise _bad("expected an object 'allowed_tools' with 'mode' and 'tools'")
        names = [_chat_name(t) for t in _tools(spec)]
    elif api == "responses":
        spec = choice
        names = [_responses_name(t) for t in _tools(spec)]
    else:
        return None
    mode = spec.get("mode")
    if mode not in _MODES:
        raise _bad(f"'mode' must be one of {list(_MODES)}, got {json.dumps(mode)[:40]}")
    return {**obj, "tool_choice": mode}, frozenset(names)


def _tools(spec: dict) -> list[Any]:
    tools = spec.get("tools")
    if not isinstance(tools, list) or not tools:
        raise _bad("'tools' must list at least one tool the model may call")
    return tools


def _chat_name(t: Any) -> str:
    fn = t.get("function") if isinstance(t, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(name, str):
        raise _bad('each tool is {"type": "function", "function": {"name": ...}}')
    return name


def _responses_name(t: Any) -> str:
    name = t.get("name") if isinstance(t, dict) else None
    if not isinstance(t, dict) or t.get("type") not in ("function", "custom"):
        kind = t.get("type") if isinstance(t, dict) else None
        raise _bad(f"only function and custom tools can be allowed, got {json.dumps(kind)[:40]}")
    if not isinstance(name, str):
        raise _bad("each allowed tool needs a 'name'")
    return name
