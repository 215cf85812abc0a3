"""A response reduced to what every protocol has: content, reasoning, tool calls, finish
reason, usage; from a non-streamed body and, by accumulating its deltas, from a stream.

Both sides reduce to the same `Output`, so a property compares them without knowing the
protocol. Reading is lenient (a missing field reads as empty): whether the shapes are right is
the framing and order properties' business, not this module's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from deepring.conformance.wire import Event


@dataclass
class Usage:
    """Token counts. `prompt` counts the whole prompt, cached part included (Anthropic's
    input_tokens leaves cache reads and writes out: they are added back here)."""

    prompt: int | None = None
    completion: int | None = None
    total: int | None = None  # None where the protocol has no total (Messages)
    cached: int | None = None  # None where the server reports no cached count
    reasoning: int | None = None
    raw: dict = field(default_factory=dict)

    def comparable(self) -> dict:
        """What two runs of one request must agree on (a cache hit may differ)."""
        return {"prompt": self.prompt, "completion": self.completion, "total": self.total}


@dataclass
class ToolCall:
    id: str | None
    name: str | None
    arguments: str  # JSON text (Messages' `input` object is serialized)


@dataclass
class Output:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish: str | None = None
    usage: Usage | None = None

    def comparable(self) -> dict:
        return {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [(c.name, json_or_text(c.arguments)) for c in self.tool_calls],
            "finish": self.finish,
            "usage": self.usage.comparable() if self.usage else None,
        }


def json_or_text(text: str) -> Any:
    try:
        return ("json", json.loads(text))
    except ValueError:
        return ("text", text)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def usage_of(protocol: str, u: Any) -> Usage | None:
    if not isinstance(u, dict):
        return None
    if protocol == "chat":
        return Usage(
            prompt=_int(u.get("prompt_tokens")),
            completion=_int(u.get("completion_tokens")),
            total=_int(u.get("total_tokens")),
            cached=_int(_get(u, "prompt_tokens_details", "cached_tokens")),
            reasoning=_int(_get(u, "completion_tokens_details", "reasoning_tokens")),
            raw=u,
        )
    if protocol == "responses":
        return Usage(
            prompt=_int(u.get("input_tokens")),
            completion=_int(u.get("output_tokens")),
            total=_int(u.get("total_tokens")),
            cached=_int(_get(u, "input_tokens_details", "cached_tokens")),
            reasoning=_int(_get(u, "output_tokens_details", "reasoning_tokens")),
            raw=u,
        )
    uncached = _int(u.get("input_tokens"))
    read = _int(u.get("cache_read_input_tokens"))
    written = _int(u.get("cache_creation_input_tokens"))
    prompt = None if uncached is None else uncached + (read or 0) + (written or 0)
    return Usage(prompt=prompt, completion=_int(u.get("output_tokens")), cached=read, raw=u)


# ---- non-streamed bodies ------------------------------------------------------------------------


def from_body(protocol: str, body: Any) -> Output:
    if protocol == "chat":
        choice = (_get(body, "choices") or [{}])[0]
        msg = _get(choice, "message") or {}
        calls = [
            ToolCall(c.get("id"), _get(c, "function", "name"), _get(c, "function", "arguments"))
            for c in msg.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        return Output(
            content=msg.get("content") or "",
            reasoning=msg.get("reasoning_content") or "",
            tool_calls=calls,
            finish=_get(choice, "finish_reason"),
            usage=usage_of(protocol, _get(body, "usage")),
        )
    if protocol == "responses":
        return responses_output(body)
    out = Output(finish=_get(body, "stop_reason"), usage=usage_of(protocol, _get(body, "usage")))
    for block in _get(body, "content") or []:
        kind = _get(block, "type")
        if kind == "text":
            out.content += block.get("text") or ""
        elif kind == "thinking":
            out.reasoning += block.get("thinking") or ""
        elif kind == "tool_use":
            args = json.dumps(block.get("input"), ensure_ascii=False)
            out.tool_calls.append(ToolCall(block.get("id"), block.get("name"), args))
    return out


def responses_output(response: Any) -> Output:
    """A Responses `response` object (the body, or the one a terminal event carries)."""
    out = Output(finish=responses_finish(response))
    out.usage = usage_of("responses", _get(response, "usage"))
    for item in _get(response, "output") or []:
        kind = _get(item, "type")
        if kind == "message":
            for part in item.get("content") or []:
                if _get(part, "type") == "output_text":
                    out.content += part.get("text") or ""
        elif kind == "reasoning":
            for part in item.get("content") or []:
                out.reasoning += _get(part, "text") or ""
        elif kind == "function_call":
            out.tool_calls.append(
                ToolCall(item.get("call_id"), item.get("name"), item.get("arguments") or "")
            )
        elif kind == "custom_tool_call":
            out.tool_calls.append(
                ToolCall(item.get("call_id"), item.get("name"), json.dumps(item.get("input")))
            )
    return out


def responses_finish(response: Any) -> str | None:
    """Responses has no finish reason: its status, and why when incomplete."""
    status = _get(response, "status")
    if status == "incomplete":
        return f"incomplete:{_get(response, 'incomplete_details', 'reason')}"
    return status


# ---- streams ------------------------------------------------------------------------------------


def from_stream(protocol: str, events: list[Event]) -> Output:
    """The output the deltas of a stream add up to."""
    payloads = [e.json for e in events if isinstance(e.json, dict)]
    if protocol == "chat":
        return chat_stream(payloads)
    if protocol == "responses":
        return _responses_stream(payloads)
    return _messages_stream(payloads)


def chat_stream(chunks: list[dict]) -> Output:
    out = Output()
    calls: dict[int, dict] = {}
    for chunk in chunks:
        if isinstance(chunk.get("usage"), dict):
            out.usage = usage_of("chat", chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = _get(choice, "delta") or {}
            out.content += delta.get("content") or ""
            out.reasoning += delta.get("reasoning_content") or ""
            for c in delta.get("tool_calls") or []:
                slot = calls.setdefault(_get(c, "index"), {"id": None, "name": None, "args": ""})
                slot["id"] = c.get("id") or slot["id"]
                slot["name"] = _get(c, "function", "name") or slot["name"]
                slot["args"] += _get(c, "function", "arguments") or ""
            if _get(choice, "finish_reason") is not None:
                out.finish = choice["finish_reason"]
    out.tool_calls = [
        ToolCall(s["id"], s["name"], s["args"])
        for _, s in sorted(calls.items(), key=lambda kv: str(kv[0]))
    ]
    return out


TERMINAL_RESPONSES = ("response.completed", "response.incomplete", "response.failed")


def _responses_stream(payloads: list[dict]) -> Output:
    out = Output()
    calls: dict[Any, dict] = {}
    for p in payloads:
        kind = p.get("type") or ""
        if kind == "response.output_text.delta":
            out.content += p.get("delta") or ""
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            out.reasoning += p.get("delta") or ""
        elif kind == "response.output_item.added":
            item = p.get("item") or {}
            if item.get("type") in ("function_call", "custom_tool_call"):
                calls[p.get("output_index")] = {
                    "id": item.get("call_id"),
                    "name": item.get("name"),
                    "args": "",
                    "custom": item.get("type") == "custom_tool_call",
                }
        elif kind in (
            "response.function_call_arguments.delta",
            "response.custom_tool_call_input.delta",
        ):
            slot = calls.get(p.get("output_index"))
            if slot is not None:
                slot["args"] += p.get("delta") or ""
        elif kind in TERMINAL_RESPONSES:
            out.finish = responses_finish(p.get("response"))
            out.usage = usage_of("responses", _get(p, "response", "usage"))
    for _, s in sorted(calls.items(), key=lambda kv: str(kv[0])):
        args = json.dumps(s["args"]) if s["custom"] else s["args"]
        out.tool_calls.append(ToolCall(s["id"], s["name"], args))
    return out


def _messages_stream(payloads: list[dict]) -> Output:
    out = Output()
    blocks: dict[Any, dict] = {}
    usage: dict = {}
    for p in payloads:
        kind = p.get("type")
        if kind == "message_start":
            usage.update(_get(p, "message", "usage") or {})
        elif kind == "content_block_start":
            blocks[p.get("index")] = {"block": p.get("content_block") or {}, "json": ""}
        elif kind == "content_block_delta":
            delta = p.get("delta") or {}
            slot = blocks.get(p.get("index"))
            dtype = delta.get("type")
            if dtype == "text_delta":
                out.content += delta.get("text") or ""
            elif dtype == "thinking_delta":
                out.reasoning += delta.get("thinking") or ""
            elif dtype == "input_json_delta" and slot is not None:
                slot["json"] += delta.get("partial_json") or ""
        elif kind == "message_delta":
            out.finish = _get(p, "delta", "stop_reason")
            # message_delta's usage is cumulative: its fields replace message_start's
            usage.update(p.get("usage") or {})
    for _, slot in sorted(blocks.items(), key=lambda kv: str(kv[0])):
        block = slot["block"]
        if block.get("type") == "tool_use":
            # an empty input streams no delta at all: the start block's input is the value
            args = slot["json"] or json.dumps(block.get("input"), ensure_ascii=False)
            out.tool_calls.append(ToolCall(block.get("id"), block.get("name"), args))
    out.usage = usage_of("messages", usage) if usage else None
    return out
