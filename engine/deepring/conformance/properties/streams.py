"""Streams: SSE framing, each protocol's event order, and agreement with the non-streamed
response of the same deterministic request."""

from __future__ import annotations

import math
from typing import Any

from deepring.conformance import outputs
from deepring.conformance.properties import Verdicts
from deepring.conformance.wire import Event, Exchange

# Fields that differ between two responses to one request by design: ids, timestamps, and the
# encrypted / signed fields that embed the response id. Usage is compared apart (cache hits).
VOLATILE = frozenset({
    "id", "created", "created_at", "completed_at", "call_id", "item_id", "encrypted_content",
    "signature", "system_fingerprint", "usage",
})  # fmt: skip


def check_framing(v: Verdicts, ex: Exchange) -> None:
    problems = list(ex.framing)
    if not ex.streamed:
        problems.insert(0, f"a stream answered with Content-Type {ex.content_type!r}")
    events = ex.events
    if ex.protocol == "chat":
        done = [i for i, e in enumerate(events) if e.data == "[DONE]"]
        if not done:
            problems.append("the stream does not end with data: [DONE]")
        elif len(done) > 1 or done[0] != len(events) - 1:
            problems.append("data: [DONE] is not the stream's single last event")
    else:
        for e in events:
            kind = e.json.get("type") if isinstance(e.json, dict) else None
            if e.name != kind:
                problems.append(f"event name {e.name!r} but data type {kind!r}")
                break
    v.check("sse_framing", "; ".join(problems[:3]))


def check_order(v: Verdicts, ex: Exchange) -> None:
    payloads = [e.json for e in ex.events if isinstance(e.json, dict)]
    order = {"chat": _chat_order, "responses": _responses_order, "messages": _messages_order}
    v.check("event_order", order[ex.protocol](payloads) if payloads else "an empty stream")


def _chat_order(chunks: list[dict]) -> str | None:
    ids = {c.get("id") for c in chunks}
    if len(ids) != 1:
        return f"chunks carry {len(ids)} different ids"
    if any(c.get("object") != "chat.completion.chunk" for c in chunks):
        return "a chunk whose object is not chat.completion.chunk"
    first = (chunks[0].get("choices") or [{}])[0].get("delta") or {}
    if first.get("role") != "assistant":
        return f"the first chunk's delta has role {first.get('role')!r}, not 'assistant'"
    finished: set = set()
    for c in chunks:
        for choice in c.get("choices") or []:
            index = choice.get("index")
            delta = choice.get("delta") or {}
            if index in finished and any(delta.get(k) for k in ("content", "tool_calls")):
                return f"choice {index} has deltas after its finish_reason"
            if choice.get("finish_reason") is not None:
                if index in finished:
                    return f"choice {index} has two finish reasons"
                finished.add(index)
    if not finished:
        return "no chunk carries a finish_reason"
    return None


def _responses_order(events: list[dict]) -> str | None:
    numbers = [e.get("sequence_number") for e in events]
    if numbers != list(range(len(events))):
        return f"sequence numbers are not 0..{len(events) - 1}: {numbers[:12]}"
    if events[0].get("type") != "response.created":
        return f"the first event is {events[0].get('type')!r}, not response.created"
    terminal = [i for i, e in enumerate(events) if e.get("type") in outputs.TERMINAL_RESPONSES]
    if terminal != [len(events) - 1]:
        return f"terminal events at {terminal} of {len(events)}: one, last, is required"
    open_items: set = set()
    closed_items: set = set()
    texts: dict[tuple, str] = {}
    for e in events[1:-1]:
        kind = e.get("type", "")
        index = e.get("output_index")
        if kind == "response.output_item.added":
            if index in open_items or index in closed_items:
                return f"output item {index} added twice"
            open_items.add(index)
        elif kind == "response.output_item.done":
            if index not in open_items:
                return f"output item {index} done but not open"
            open_items.discard(index)
            closed_items.add(index)
        elif index is not None and index not in open_items:
            return f"{kind} for output item {index}, which is not open"
        key = (index, e.get("content_index"), kind.rsplit(".", 1)[0])
        if kind.endswith(".delta") and isinstance(e.get("delta"), str):
            texts[key] = texts.get(key, "") + e["delta"]
        elif kind.endswith(".done") and isinstance(e.get("text", e.get("arguments")), str):
            done = e.get("text", e.get("arguments"))
            if done != texts.get(key, ""):
                return f"{kind} says {done!r}, its deltas add up to {texts.get(key, '')!r}"
    if open_items:
        return f"output items {sorted(open_items, key=str)} never done"
    return None


_DELTA_OF = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "redacted_thinking": set(),
    "tool_use": {"input_json_delta"},
}


def _messages_order(events: list[dict]) -> str | None:
    kinds = [e.get("type") for e in events if e.get("type") != "ping"]
    if kinds[:1] != ["message_start"]:
        return f"the first event is {kinds[0]!r}, not message_start"
    if kinds[-2:] != ["message_delta", "message_stop"]:
        return f"the stream ends with {kinds[-2:]}, not message_delta, message_stop"
    if kinds.count("message_delta") != 1 or kinds.count("message_stop") != 1:
        return "more than one message_delta or message_stop"
    open_block: tuple | None = None
    next_index = 0
    for e in events[1:]:
        kind = e.get("type")
        if kind == "content_block_start":
            if open_block is not None:
                return f"block {e.get('index')} starts while block {open_block[0]} is open"
            if e.get("index") != next_index:
                return f"block index {e.get('index')}, expected {next_index}"
            open_block = (e.get("index"), (e.get("content_block") or {}).get("type"))
            next_index += 1
        elif kind == "content_block_delta":
            if open_block is None or e.get("index") != open_block[0]:
                return f"a delta for block {e.get('index')}, which is not open"
            dtype = (e.get("delta") or {}).get("type")
            if dtype not in _DELTA_OF.get(open_block[1], {dtype}):
                return f"a {dtype} in a {open_block[1]} block"
        elif kind == "content_block_stop":
            if open_block is None or e.get("index") != open_block[0]:
                return f"content_block_stop for block {e.get('index')}, which is not open"
            open_block = None
        elif kind == "message_delta" and open_block is not None:
            return f"message_delta while block {open_block[0]} is open"
    return None


def check_agreement(v: Verdicts, streamed: Exchange, plain: Exchange, greedy: bool) -> None:
    """Both answers to the deterministic request (the streamed one and the plain one); greedy:
    whether the server decodes it greedily (oracle.expect). A sampled request's two answers
    may differ: only the stream's agreement with its own final object is checked then."""
    if streamed.ok != plain.ok:
        v.fail(
            "stream_agrees",
            f"streamed: HTTP {streamed.status or streamed.error}, "
            f"non-streamed: HTTP {plain.status or plain.error}",
        )
        return
    if not streamed.ok:
        return
    if not greedy:
        if streamed.protocol == "responses":
            v.check("stream_accumulates", _responses_self_diff(streamed.events))
        return
    got = outputs.from_stream(streamed.protocol, streamed.events).comparable()
    want = outputs.from_body(plain.protocol, plain.json).comparable()
    diffs = [f"{k}: stream {got[k]!r} vs body {want[k]!r}" for k in want if got[k] != want[k]]
    v.check("stream_agrees", "; ".join(diffs)[:600])
    v.check("stream_accumulates", _accumulated_diff(streamed.protocol, streamed.events, plain.json))


def _responses_self_diff(events: list[Event]) -> str | None:
    """A Responses stream's deltas against the response its terminal event carries."""
    payloads = [e.json for e in events if isinstance(e.json, dict)]
    terminal = [p for p in payloads if p.get("type") in outputs.TERMINAL_RESPONSES]
    if not terminal:
        return "no terminal event carries the response"
    deltas = outputs.from_stream("responses", events).comparable()
    final = outputs.responses_output(terminal[-1].get("response")).comparable()
    if deltas != final:
        return f"the deltas add up to {deltas!r}, the terminal response says {final!r}"
    return None


def _accumulated_diff(protocol: str, events: list[Event], body: Any) -> str | None:
    payloads = [e.json for e in events if isinstance(e.json, dict)]
    if protocol == "responses":
        # the deltas against the terminal event's own response...
        problem = _responses_self_diff(events)
        if problem:
            return problem
        terminal = [p for p in payloads if p.get("type") in outputs.TERMINAL_RESPONSES]
        accumulated = terminal[-1].get("response")
    elif protocol == "chat":
        accumulated = _chat_object(payloads)
    else:
        accumulated = _messages_object(payloads)
    # ...and the accumulated object against the body, field by field
    return _first_difference(_stable(accumulated), _stable(body))


def _chat_object(chunks: list[dict]) -> dict:
    out = outputs.chat_stream(chunks)
    first = chunks[0] if chunks else {}
    message: dict[str, Any] = {"role": "assistant", "content": out.content or None}
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    if out.tool_calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in out.tool_calls
        ]
    return {
        "object": "chat.completion",
        "model": first.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": out.finish}],
    }


def _chat_view(body: dict) -> dict:
    """The fields of a Chat body that a stream carries too."""
    choice = (body.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    message = {"role": msg.get("role"), "content": msg.get("content") or None}
    if msg.get("reasoning_content"):
        message["reasoning_content"] = msg["reasoning_content"]
    if msg.get("tool_calls"):
        message["tool_calls"] = [
            {"type": c.get("type"), "function": c.get("function")} for c in msg["tool_calls"]
        ]
    return {
        "object": body.get("object"),
        "model": body.get("model"),
        "choices": [
            {
                "index": choice.get("index"),
                "message": message,
                "finish_reason": choice.get("finish_reason"),
            }
        ],
    }


def _messages_object(events: list[dict]) -> dict:
    message: dict[str, Any] = {}
    blocks: list[dict] = []
    partial: dict[int, str] = {}
    for e in events:
        kind = e.get("type")
        if kind == "message_start":
            message = dict(e.get("message") or {})
        elif kind == "content_block_start":
            blocks.append(dict(e.get("content_block") or {}))
        elif kind == "content_block_delta" and blocks:
            delta, block = e.get("delta") or {}, blocks[-1]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + (delta.get("text") or "")
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + (delta.get("thinking") or "")
            elif delta.get("type") == "input_json_delta":
                partial[len(blocks) - 1] = partial.get(len(blocks) - 1, "") + (
                    delta.get("partial_json") or ""
                )
        elif kind == "message_delta":
            message.update(e.get("delta") or {})
    for index, text in partial.items():
        blocks[index]["input"] = outputs.json_or_text(text)[1]
    message["content"] = blocks
    return message


def _stable(value: Any) -> Any:
    """The value without the fields that differ by design (VOLATILE) and without a Chat
    body's own extras."""
    if isinstance(value, dict):
        if value.get("object") == "chat.completion":
            value = _chat_view(value)
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _first_difference(got: Any, want: Any, path: str = "") -> str | None:
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            if key not in got:
                return f"{path}.{key}: in the body, not in the stream"
            if key not in want:
                return f"{path}.{key}: in the stream, not in the body"
            d = _first_difference(got[key], want[key], f"{path}.{key}")
            if d:
                return d
        return None
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return f"{path}: {len(got)} items in the stream, {len(want)} in the body"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            d = _first_difference(g, w, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(got, float) and isinstance(want, float) and _close(got, want):
        return None
    if got != want:
        return f"{path}: stream {got!r} vs body {want!r}"[:400]
    return None


def _close(a: float, b: float) -> bool:
    """Floats (log probabilities) within 1e-3: of two identical requests the second may hit
    the prefix cache, which computes the same logits in another order (same tokens, last
    digits apart)."""
    return math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-3)
