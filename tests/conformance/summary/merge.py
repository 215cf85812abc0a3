"""Merging consecutive deltas of one block (the event list of `reduce_events`)."""

from __future__ import annotations

import copy
import json
from typing import Any


def _chat_delta_key(chunk: dict) -> tuple | None:
    """Merge key of a Chat chunk that only carries text or argument fragments, else None."""
    if chunk.get("usage") is not None or len(chunk.get("choices", [])) != 1:
        return None
    choice = chunk["choices"][0]
    if choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta", {})
    if "role" in delta:
        return None
    rest = {k: v for k, v in chunk.items() if k != "choices"}
    envelope = json.dumps(rest, sort_keys=True)
    keys = tuple(sorted(delta))
    if isinstance(delta.get("tool_calls"), list):
        calls = delta["tool_calls"]
        if len(calls) != 1 or "id" in calls[0] or set(calls[0]) != {"index", "function"}:
            return None
        if set(calls[0]["function"]) != {"arguments"}:
            return None
        return ("args", calls[0]["index"], keys, envelope)
    if isinstance(delta.get("reasoning_content"), str) and delta.get("content") is None:
        return ("reasoning", keys, envelope)
    if isinstance(delta.get("content"), str) and delta.get("reasoning_content") is None:
        return ("content", keys, envelope)
    return None


def _chat_text(chunk: dict) -> str:
    delta = chunk["choices"][0]["delta"]
    if "tool_calls" in delta:
        return delta["tool_calls"][0]["function"]["arguments"]
    if isinstance(delta.get("reasoning_content"), str) and delta.get("content") is None:
        return delta["reasoning_content"]
    return delta["content"]


def _chat_set_text(chunk: dict, text: str) -> None:
    delta = chunk["choices"][0]["delta"]
    if "tool_calls" in delta:
        delta["tool_calls"][0]["function"]["arguments"] = text
    elif isinstance(delta.get("reasoning_content"), str) and delta.get("content") is None:
        delta["reasoning_content"] = text
    else:
        delta["content"] = text


def _chat_merge(a: dict, b: dict) -> None:
    _chat_set_text(a, _chat_text(a) + _chat_text(b))
    la, lb = a["choices"][0].get("logprobs"), b["choices"][0].get("logprobs")
    if la is not None or lb is not None:
        # Per field: reasoning deltas carry `reasoning_content` log probabilities.
        merged: dict = {}
        for part in (la or {}, lb or {}):
            for key, entries in part.items():
                merged.setdefault(key, []).extend(entries or [])
        a["choices"][0]["logprobs"] = merged


DELTA_FIELD = {
    "response.reasoning_text.delta": "delta",
    "response.output_text.delta": "delta",
    "response.function_call_arguments.delta": "delta",
    "response.custom_tool_call_input.delta": "delta",
}


def _responses_key(event: dict) -> tuple | None:
    kind = event.get("type")
    if kind not in DELTA_FIELD:
        return None
    rest = {k: v for k, v in event.items() if k not in ("delta", "sequence_number", "logprobs")}
    return (kind, json.dumps(rest, sort_keys=True))


def _messages_key(event: dict) -> tuple | None:
    if event.get("type") != "content_block_delta":
        return None
    delta = event.get("delta", {})
    kind = delta.get("type")
    if kind not in ("thinking_delta", "text_delta", "input_json_delta"):
        return None
    return (event.get("index"), kind)


MESSAGES_FIELD = {
    "thinking_delta": "thinking",
    "text_delta": "text",
    "input_json_delta": "partial_json",
}


def merge_deltas(protocol: str, events: list[tuple[Any, dict]]) -> list[list]:
    """Merge consecutive deltas of one block, drop empty deltas, renumber Responses events."""
    out: list[list] = []
    last_key = None
    for name, original in events:
        event = copy.deepcopy(original)
        if protocol == "chat":
            key = _chat_delta_key(event)
            if (
                key is not None
                and _chat_text(event) == ""
                and (event["choices"][0].get("logprobs") is None)
            ):
                continue
            if key is not None and key == last_key:
                _chat_merge(out[-1][1], event)
                continue
        elif protocol == "responses":
            key = _responses_key(event)
            if key is not None and event.get("delta", "") == "" and not event.get("logprobs"):
                continue
            if key is not None and key == last_key:
                prev = out[-1][1]
                prev["delta"] += event["delta"]
                if "logprobs" in prev or "logprobs" in event:
                    prev["logprobs"] = (prev.get("logprobs") or []) + (event.get("logprobs") or [])
                continue
        else:
            key = _messages_key(event)
            if key is not None:
                field = MESSAGES_FIELD[key[1]]
                if event["delta"].get(field, "") == "":
                    continue
                if key == last_key:
                    out[-1][1]["delta"][field] += event["delta"][field]
                    continue
        out.append([name, event])
        last_key = key
    if protocol == "responses":
        for index, (_, event) in enumerate(out):
            if "sequence_number" in event:
                event["sequence_number"] = index
    return out
