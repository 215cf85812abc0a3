"""Streams (issue 5): push one chunking through `StreamProcessor` and reduce the events."""

from __future__ import annotations

import json
import re
from typing import Any

from .common import REQUEST_CLASS, RESPONSE_CLASS, attempt, exc_summary
from .conversion import parsing_summary
from .merge import merge_deltas
from .options import build_options

# `call_NN_` + 24 random alphanumerics (the official's last 4 are always digits); a call that
# opens the reasoning itself (no reasoning text before the DSML block) gets `call_NN_ET_...`.
CALL_ID = re.compile(r"^call_(\d{2})_(ET_)?[A-Za-z0-9]{24}$")
TIMESTAMP_KEYS = ("created", "created_at", "completed_at")


class Normaliser:
    """Replaces random call ids by their shape and wall-clock timestamps by "<ts>", checking
    that each call index keeps one id throughout a response."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}
        self.problems: list[str] = []

    def __call__(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {k: self(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        if key in TIMESTAMP_KEYS and isinstance(value, int) and not isinstance(value, bool):
            return "<ts>"
        if isinstance(value, str) and value.startswith("call_"):
            match = CALL_ID.match(value)
            if match is None:
                self.problems.append(f"call id of unexpected shape: {value!r}")
                return value
            index, marker = match.group(1), match.group(2) or ""
            if self.ids.setdefault(index, value) != value:
                self.problems.append(f"call index {index} has two ids")
            return f"call_{index}_{marker}<id>"
        return value


def build_chunks(M: Any, chunking: dict) -> list:
    """InferenceChunks of a chunking: {"mode": "text", "pieces": [[text, token_count], ...]}
    or {"mode": "tokens", "groups": [[ids, logprobs|None], ...]}."""
    if chunking["mode"] == "text":
        return [M.InferenceChunk.text(text, count) for text, count in chunking["pieces"]]
    chunks = []
    for ids, logprobs in chunking["groups"]:
        if logprobs is None:
            chunks.append(M.InferenceChunk.tokens(ids))
        else:
            chunks.append(
                M.InferenceChunk.tokens(
                    ids, [(lp, [tuple(t) for t in top]) for lp, top in logprobs]
                )
            )
    return chunks


def make_generator(M: Any, case: dict, request: Any, converted: Any, extras: dict) -> Any:
    protocol = case["protocol"]
    cls = getattr(M, REQUEST_CLASS[protocol])
    generator = cls.chunk_generator(converted, "resp_1", "model-x")
    if protocol == "responses":
        generator = generator.with_namespace_tool_map(extras["namespaces"])
        generator = generator.with_echo(extras["echo"])
    elif protocol == "messages" and case.get("signature") is not None:
        generator = generator.with_signature(case["signature"])
    return generator


def run_stream(M: Any, case: dict, chunking: dict, tokenizer: Any = None) -> dict:
    """Convert the case's request, stream `chunking` through the processor and reduce it.

    case = {"protocol", "body", "options": spec, "ready": bool, "finish": "Stop"|...,
            "signature": str|None, "stop_override": [str]|None}
    """
    protocol = case["protocol"]
    request = getattr(M, REQUEST_CLASS[protocol])(case["body"])
    options = build_options(M, case.get("options"))
    extras = {}
    if protocol == "responses":
        extras["namespaces"] = request.namespace_tool_map(options)
        extras["echo"] = request.echo()
    converted = request.convert(options)
    parsing = converted.parsing_options
    if case.get("stop_override") is not None:
        parsing.stop_sequences = case["stop_override"]
    generator = make_generator(M, case, request, converted, extras)
    processor = M.StreamProcessor(generator, parsing, tokenizer)
    events: list = []
    pushed = 0
    stopped_early = False
    error = None
    try:
        if case.get("ready", True):
            events += processor.push(
                M.InferenceChunk.ready(
                    prompt_usage=M.PromptUsage(prompt_tokens=10, prompt_cache_hit_tokens=3),
                    system_fingerprint="fp_x",
                )
            )
        for chunk in build_chunks(M, chunking):
            if processor.finished:
                stopped_early = True
                break
            events += processor.push(chunk)
            pushed += 1
        if not processor.finished:
            reason = getattr(M.InferenceFinishReason, case.get("finish", "Stop"))
            events += processor.push(M.InferenceChunk.finish(reason))
        else:
            stopped_early = True
        events += processor.finish()
        again = processor.finish()
        finished = processor.finished
    except RuntimeError as exc:
        error = exc_summary(M, exc)
        again, finished = [], None
    after_finish = attempt(M, processor.push, M.InferenceChunk.text("x", 1))
    return reduce_events(M, protocol, events) | {
        "parsing": parsing_summary(M, parsing),
        "error": error,
        "stopped_early": stopped_early,
        "finished": finished,
        "finish_again": len(again),
        "push_after_finish": after_finish[1] if not after_finish[0] else "<accepted>",
    }


def _event_data(events: list) -> list[dict]:
    return [json.loads(e.to_json()) for e in events]


def reduce_events(M: Any, protocol: str, events: list) -> dict:
    """The chunking-independent view of one protocol stream.

    - "text": concatenated reasoning / content deltas, tool calls (index, name, concatenated
      argument fragments), finish reason, usage, stop sequence, logprobs;
    - "events": the event list with consecutive deltas of the same block merged, empty
      deltas dropped and Responses sequence numbers renumbered (each entry is [sse name, data]);
    - "accumulated": the non-streaming response accumulated from every event;
    - "problems": per-event invariants that failed (SSE names, sequence numbers, id shapes).
    """
    response_cls = getattr(M, RESPONSE_CLASS[protocol])
    normalise = Normaliser()
    names = [response_cls.sse_event_name(e) for e in events]
    data = _event_data(events)
    problems: list[str] = []
    for name, item in zip(names, data, strict=True):
        expected = None if protocol == "chat" else item.get("type")
        if name != expected:
            problems.append(f"sse name {name!r} for event of type {item.get('type')!r}")
    if protocol == "responses":
        numbers = [item.get("sequence_number") for item in data]
        if numbers != list(range(len(numbers))):
            problems.append(f"sequence numbers {numbers}")
    accumulated = response_cls("resp_1", "model-x", 0, 10, 3)
    for event in events:
        accumulated.accumulate(event)
    data = normalise(data)
    reducer = {"chat": _reduce_chat, "responses": _reduce_responses, "messages": _reduce_messages}
    text = reducer[protocol](data)
    merged = merge_deltas(protocol, list(zip(names, data, strict=True)))
    out = {
        "text": text,
        "events": merged,
        "accumulated": normalise(json.loads(accumulated.to_json())),
        "sse_done_data": response_cls.sse_done_data(),
        "problems": problems + normalise.problems,
    }
    return out


def _reduce_chat(data: list[dict]) -> dict:
    reasoning, content, calls = [], [], {}
    finish, usage, logprobs, fingerprints, roles = None, None, [], [], []
    for chunk in data:
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        if chunk.get("system_fingerprint") not in fingerprints:
            fingerprints.append(chunk.get("system_fingerprint"))
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            if "role" in delta:
                roles.append(delta["role"])
            if isinstance(delta.get("reasoning_content"), str):
                reasoning.append(delta["reasoning_content"])
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(
                    call.get("index"), {"id": None, "type": None, "name": None, "arguments": []}
                )
                if "id" in call:
                    entry["id"] = call["id"]
                    entry["type"] = call.get("type")
                function = call.get("function", {})
                if "name" in function:
                    entry["name"] = function["name"]
                entry["arguments"].append(function.get("arguments", ""))
            if choice.get("finish_reason") is not None:
                finish = choice["finish_reason"]
            if choice.get("logprobs") is not None:
                logprobs.extend(choice["logprobs"].get("content") or [])
    return {
        "roles": roles,
        "reasoning": "".join(reasoning),
        "content": "".join(content),
        "tool_calls": [
            [index, c["id"], c["type"], c["name"], "".join(c["arguments"])]
            for index, c in sorted(calls.items(), key=lambda kv: str(kv[0]))
        ],
        "finish_reason": finish,
        "usage": usage,
        "system_fingerprints": fingerprints,
        "logprobs": logprobs,
    }


def _reduce_responses(data: list[dict]) -> dict:
    items: dict[int, dict] = {}
    terminal, usage, logprobs = None, None, []
    for event in data:
        kind = event.get("type", "")
        index = event.get("output_index")
        if kind == "response.output_item.added":
            item = event["item"]
            items[index] = {
                "type": item.get("type"),
                "name": item.get("name"),
                "namespace": item.get("namespace"),
                "call_id": item.get("call_id"),
                "text": [],
            }
        elif kind.endswith(".delta") and index in items:
            items[index]["text"].append(event.get("delta", ""))
            logprobs.extend(event.get("logprobs") or [])
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            terminal = [
                kind,
                event["response"].get("status"),
                event["response"].get("incomplete_details"),
            ]
            usage = event["response"].get("usage")
    return {
        "items": [
            [index, i["type"], i["name"], i["namespace"], i["call_id"], "".join(i["text"])]
            for index, i in sorted(items.items())
        ],
        "terminal": terminal,
        "usage": usage,
        "logprobs": logprobs,
    }


def _reduce_messages(data: list[dict]) -> dict:
    blocks: dict[int, dict] = {}
    stop, usage = None, None
    for event in data:
        kind = event.get("type")
        if kind == "content_block_start":
            block = event["content_block"]
            blocks[event["index"]] = {
                "type": block.get("type"),
                "name": block.get("name"),
                "id": block.get("id"),
                "text": [],
                "signature": [],
            }
        elif kind == "content_block_delta" and event.get("index") in blocks:
            delta = event["delta"]
            entry = blocks[event["index"]]
            for field in ("thinking", "text", "partial_json"):
                if field in delta:
                    entry["text"].append(delta[field])
            if "signature" in delta:
                entry["signature"].append(delta["signature"])
        elif kind == "message_delta":
            stop = [event["delta"].get("stop_reason"), event["delta"].get("stop_sequence")]
            usage = event.get("usage")
    return {
        "blocks": [
            [index, b["type"], b["name"], b["id"], "".join(b["text"]), "".join(b["signature"])]
            for index, b in sorted(blocks.items())
        ],
        "stop": stop,
        "usage": usage,
    }
