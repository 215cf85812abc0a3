"""Wrong JSON types everywhere (issue 3): deepring_recipe vs the official wheel.

For a few rich, valid bodies per protocol, every value in the body is replaced in turn by a value
of each JSON type (integer, float, boolean, null, string, list, object), and every object gets
known field names added with a wrongly typed value. The whole pipeline summary (construction
error text, conversion, prompts) must be the official's for each variant. The property suite
draws bodies at random; this one walks every position of a fixed body, so a field the official
type-checks and we ignore (or the reverse) cannot hide behind chance.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import deepring_recipe as ours
import deepseek_recipe as official
import pytest
import summary as S

ALTERNATIVES: list[Any] = [7, 1.5, True, None, "s", [], {}]
# Wrong-typed values for added fields (the names come from the bodies and the protocols' specs).
ADDED: list[Any] = [1.5, [], True]
EXTRA_NAMES = [
    "name", "signature", "cache_control", "citations", "id", "status", "metadata", "user",
    "store", "service_tier", "logit_bias", "modalities", "audio", "prediction", "refusal",
    "annotations", "title", "context", "is_error", "detail", "file_id", "filename", "strict",
    "description", "parameters", "defer_loading", "format", "verbosity", "truncation", "include",
    "background", "instructions", "previous_response_id", "top_k", "stop_sequences", "system",
    "container", "encrypted_content", "summary", "phase", "call_id", "output", "namespace",
    "prefix", "reasoning_content", "tool_calls", "tool_call_id", "budget_tokens", "effort",
    "disable_parallel_tool_use", "search_context_size", "user_location", "parallel_tool_calls",
]  # fmt: skip
# recipe/DEVIATIONS.md R1: we read and check this field, the official ignores it.
DEVIATING_FIELDS = {"chat": {"max_completion_tokens"}}

TOOL_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
PNG = "data:image/png;base64,iVBORw0KGgo="

CHAT = {
    "model": "DeepSeek-V4.1-Flash",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in the picture?"},
                {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Look it up.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": TOOL_PARAMS,
                "strict": True,
            },
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "thinking": {"type": "disabled"},
    "temperature": 0.5,
    "top_p": 0.9,
    "max_tokens": 100,
    "stop": ["END"],
    "seed": 3,
    "logprobs": True,
    "top_logprobs": 2,
    "stream": True,
    "stream_options": {"include_usage": True},
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "n": 1,
    "parallel_tool_calls": True,
}

CHAT_JSON = {
    "model": "DeepSeek-V4.1-Flash",
    "messages": [{"role": "user", "content": "Answer in json."}],
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": TOOL_PARAMS, "strict": True},
    },
    "reasoning_effort": "high",
}

RESPONSES = {
    "model": "DeepSeek-V4.1-Flash",
    "instructions": "Be brief.",
    "input": [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather?"},
                {"type": "input_image", "image_url": PNG, "detail": "auto"},
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Think."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
        {"role": "user", "content": "Tomorrow?"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather.",
            "parameters": TOOL_PARAMS,
            "strict": False,
        },
        {"type": "custom", "name": "apply_patch"},
        {
            "type": "namespace",
            "name": "files",
            "description": "File tools.",
            "tools": [{"type": "function", "name": "read", "parameters": TOOL_PARAMS}],
        },
    ],
    "tool_choice": "auto",
    "reasoning": {"effort": "medium", "summary": "auto"},
    "text": {"format": {"type": "text"}, "verbosity": "low"},
    "max_output_tokens": 200,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_logprobs": 1,
    "stream": False,
    "user": "u1",
}

MESSAGES = {
    "model": "DeepSeek-V4.1-Flash",
    "max_tokens": 300,
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "QQ=="},
                },
                {"type": "document", "source": {"type": "text", "data": "notes"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": "sig"},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "Sunny"}],
                    "is_error": False,
                }
            ],
        },
    ],
    "tools": [
        {"name": "get_weather", "description": "Weather.", "input_schema": TOOL_PARAMS},
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "metadata": {"user_id": "u1"},
    "stop_sequences": ["END"],
    "temperature": 0.5,
    "top_p": 0.9,
    "stream": True,
}

RESPONSES_2 = {
    "model": "DeepSeek-V4.1-Flash",
    "input": [
        {"role": "user", "content": "Patch it and answer in json."},
        {
            "type": "custom_tool_call",
            "call_id": "call_2",
            "name": "apply_patch",
            "input": "*** Begin Patch",
        },
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done"},
        {"role": "user", "content": "json please"},
    ],
    "tools": [
        {"type": "custom", "name": "apply_patch"},
        {
            "type": "web_search",
            "search_context_size": "low",
            "user_location": {"type": "approximate", "city": "Paris", "country": "FR"},
        },
    ],
    "tool_choice": {"type": "custom", "name": "apply_patch"},
    "text": {"format": {"type": "json_schema", "name": "answer", "schema": TOOL_PARAMS}},
    "reasoning": {"effort": "none"},
}

MESSAGES_2 = {
    "model": "DeepSeek-V4.1-Flash",
    "max_tokens": 300,
    "system": "Be brief.",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Find it."},
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
                {"type": "text", "text": "Found."},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Now search more."},
                {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "lookup"}},
            ],
        },
    ],
    "tools": [
        {"name": "get_weather", "input_schema": TOOL_PARAMS},
        {"name": "lookup", "input_schema": TOOL_PARAMS, "defer_loading": True},
        {"type": "web_search_20250305", "name": "web_search"},
    ],
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "output_config": {"effort": "low"},
}

BODIES = {
    "chat": [CHAT, CHAT_JSON],
    "responses": [RESPONSES, RESPONSES_2],
    "messages": [MESSAGES, MESSAGES_2],
}


def positions(value: Any, path: tuple = ()) -> list[tuple[tuple, str]]:
    """(path, "value") for every value below the top level, (path, "object") for every object."""
    out: list[tuple[tuple, str]] = []
    if isinstance(value, dict):
        out.append((path, "object"))
        for k, v in value.items():
            out += [((*path, k), "value"), *positions(v, (*path, k))]
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += [((*path, i), "value"), *positions(v, (*path, i))]
    return out


def at(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


def mutants(protocol: str, body: dict):
    skip = DEVIATING_FIELDS.get(protocol, set())
    keys = {k for p, _ in positions(body) for k in p if isinstance(k, str)}
    names = sorted(keys | set(EXTRA_NAMES))
    for path, kind in positions(body):
        if kind == "value":
            if path[-1] in skip:
                continue
            for alt in ALTERNATIVES:
                yield path, alt
        else:
            present = at(body, path)
            for i, name in enumerate(n for n in names if n not in present and n not in skip):
                yield (*path, name), ADDED[i % len(ADDED)]


def summary(M: Any, protocol: str, body: dict) -> dict:
    return S.request_summary(M, {"protocol": protocol, "body": body, "options": {}})


@pytest.mark.parametrize("protocol", S.PROTOCOLS)
def test_every_position_with_every_json_type(protocol):
    failures: list[str] = []
    for body in BODIES[protocol]:
        case = {"protocol": protocol, "body": body, "options": {}}
        mine, theirs = S.adjust_for_deviations(
            case, summary(ours, protocol, body), summary(official, protocol, body)
        )
        assert "construct" not in theirs, "the base body must be valid"
        assert S.canonical_json(mine) == S.canonical_json(theirs)
        for path, value in mutants(protocol, body):
            mutant = copy.deepcopy(body)
            at(mutant, path[:-1])[path[-1]] = value
            case = {"protocol": protocol, "body": mutant, "options": {}}
            mine, theirs = S.adjust_for_deviations(
                case, summary(ours, protocol, mutant), summary(official, protocol, mutant)
            )
            if S.canonical_json(mine) != S.canonical_json(theirs):
                where = S.first_difference(mine, theirs)
                failures.append(f"{list(path)} = {json.dumps(value)}: {where}")
    assert not failures, f"{len(failures)} mutations differ:\n" + "\n".join(failures[:20])
