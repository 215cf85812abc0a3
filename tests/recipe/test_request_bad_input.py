"""Bad request input for all three protocols, deepring_recipe against the official wheel.

Complements `tests/conformance/test_requests_malformed.py`, which already compares both
libraries on malformed bodies (`test_malformed_body`: nesting 126..100000 in an unknown field,
circular references in an unknown field and at the top level, non-dict bodies, bad JSON texts,
invalid UTF-8 in the model name, wrong types of top-level fields) and on huge bodies
(`test_huge_body`: 10 MB content as dict / str / bytes, 20k messages, converted and rendered in
under 20 s). What is added here:

- nesting at and past the depth limit inside values conversion keeps and walks (tool parameter
  schemas, strict schemas, a response schema, Messages `tool_use.input`), as a Python body and
  as JSON text, and deep JSON inside tool-call `arguments` strings, which the body limit does
  not cover;
- circular references inside the request's own fields (messages, content parts, schemas,
  Responses input, Messages tool input);
- invalid UTF-8 inside message content of a bytes body, and a lone surrogate in a str content;
- wrong types of nested fields, per protocol;
- a 10 MB content rendered *and encoded* with the fixture tokenizer (slow tier).

Where both libraries must agree, the whole pipeline summary of the conformance suite is
compared; on top of that each rejection must be an ordinary exception whose message names the
problem. Python bodies nested too deeply raise `RecursionError` (a `RuntimeError`) in both
libraries, JSON texts a `ValueError`: ours keeps the official's types.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import deepring_recipe as ours
import deepseek_recipe as official
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import summary as S

MODEL = "DeepSeek-V4.1-Flash"
NEST = "__NESTED__"


@pytest.fixture(scope="module")
def tokenizers(v41_tokenizer_path):
    path = str(v41_tokenizer_path)
    return {
        ours: ours.Tokenizer.from_file(path),
        official: official.Tokenizer.from_file(path),
    }


def both(protocol: str, body: Any, tokenizers: dict | None = None) -> tuple[dict, dict]:
    """(ours, official) pipeline summaries of one body with default options."""
    case = {"protocol": protocol, "body": body, "options": {}}
    tok = tokenizers or {}
    return (
        S.request_summary(ours, case, tok.get(ours)),
        S.request_summary(official, case, tok.get(official)),
    )


def assert_same(actual: dict, expected: dict) -> None:
    if S.canonical_json(actual) != S.canonical_json(expected):
        raise AssertionError(
            f"deepring_recipe differs from deepseek_recipe at "
            f"{S.first_difference(actual, expected)} "
            f"(ours: {S.outcome_label(actual)}, official: {S.outcome_label(expected)})"
        )


def rejection(summary: dict) -> dict | None:
    return summary.get("construct") or summary.get("convert")


# ---------------------------------------------------------------------------------------------
# deep nesting inside kept values


def nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def nested_schema_text(levels: int) -> str:
    return '{"type": "object", "properties": {"a": ' * levels + '{"type": "string"}' + "}}" * levels


def nested_value(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"k": value}
    return value


def nested_value_text(levels: int) -> str:
    return '{"k": ' * levels + "1" + "}" * levels


# name -> (protocol, body with NEST where the nested value goes, "schema" | "value")
NEST_POSITIONS: dict[str, tuple[str, dict, str]] = {
    "chat-tool-parameters": (
        "chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": NEST}}],
        },
        "schema",
    ),
    "chat-strict-tool-parameters": (
        "chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": NEST}}
            ],
        },
        "schema",
    ),
    "chat-strict-response-format": (
        "chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi json"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "strict": True, "schema": NEST},
            },
        },
        "schema",
    ),
    "responses-strict-tool-parameters": (
        "responses",
        {
            "model": MODEL,
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "strict": True, "parameters": NEST}],
        },
        "schema",
    ),
    "messages-tool-input-schema": (
        "messages",
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": NEST}],
        },
        "schema",
    ),
    "messages-tool-use-input": (
        "messages",
        {
            "model": MODEL,
            "max_tokens": 5,
            "thinking": {"type": "disabled"},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": NEST}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
                },
            ],
        },
        "value",
    ),
}
# Levels around the 128-deep limit for each kind (a schema level is two JSON levels; the body
# around the nested value is 5-6 levels deep), plus one far past it.
LEVELS = {"schema": (30, 60, 61, 62, 63, 64, 50_000), "value": (60, 122, 123, 124, 125, 100_000)}


def substitute(value: Any, replacement: Any) -> Any:
    if value == NEST:
        return replacement
    if isinstance(value, dict):
        return {k: substitute(v, replacement) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, replacement) for v in value]
    return value


def nest_cases():
    for name, (protocol, template, kind) in NEST_POSITIONS.items():
        for levels in LEVELS[kind]:
            for form in ("dict", "text"):
                yield pytest.param(
                    protocol, template, kind, levels, form, id=f"{name}-{levels}-{form}"
                )


@pytest.mark.parametrize(("protocol", "template", "kind", "levels", "form"), list(nest_cases()))
def test_deep_nesting_inside_kept_values(protocol, template, kind, levels, form, tokenizers):
    if form == "dict":
        value = nested_schema(levels) if kind == "schema" else nested_value(levels)
        body: Any = substitute(template, value)
    else:
        text = nested_schema_text(levels) if kind == "schema" else nested_value_text(levels)
        body = json.dumps(template).replace(json.dumps(NEST), text)
    mine, theirs = both(protocol, body, tokenizers)
    assert_same(mine, theirs)
    error = mine.get("construct")
    if error is not None:
        if form == "dict":
            assert error["error"] == "RecursionError", error
            assert "maximum nesting depth of 128" in error["message"], error
        else:
            assert error["error"] == "ValueError", error
            assert "recursion limit exceeded" in error["message"], error


@pytest.mark.parametrize("depth", [10, 127, 128, 129, 1000, 100_000])
@pytest.mark.parametrize("protocol", ["chat", "responses"])
def test_deep_json_in_tool_call_arguments(protocol, depth, tokenizers):
    """`arguments` is a string, so the body's depth limit does not apply to the JSON inside it;
    it is read and rendered as the official does, without a crash."""
    arguments = '{"a": ' + "[" * depth + "]" * depth + "}"
    tools_chat = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    if protocol == "chat":
        body = {
            "model": MODEL,
            "thinking": {"type": "disabled"},
            "tools": tools_chat,
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": arguments},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
        }
    else:
        body = {
            "model": MODEL,
            "reasoning": {"effort": "none"},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "input": [
                {"role": "user", "content": "q"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
                {"type": "function_call_output", "call_id": "c1", "output": "r"},
            ],
        }
    mine, theirs = both(protocol, body, tokenizers)
    assert_same(mine, theirs)


# ---------------------------------------------------------------------------------------------
# circular references inside the request's fields


def circular_bodies() -> list[tuple[str, str, Any]]:
    messages: list = [{"role": "user", "content": "hi"}]
    messages.append(messages)
    parts: list = [{"type": "text", "text": "x"}]
    parts.append(parts)
    schema: dict = {"type": "object", "properties": {}}
    schema["properties"]["self"] = schema
    through_list: dict = {"type": "object", "anyOf": []}
    through_list["anyOf"].append(through_list)
    tool_input: dict = {"a": 1}
    tool_input["b"] = [tool_input]
    return [
        ("chat messages list", "chat", {"model": MODEL, "messages": messages}),
        (
            "chat content parts",
            "chat",
            {"model": MODEL, "messages": [{"role": "user", "content": parts}]},
        ),
        (
            "chat tool parameters",
            "chat",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
            },
        ),
        (
            "chat response schema through a list",
            "chat",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi json"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": through_list},
                },
            },
        ),
        ("responses input list", "responses", {"model": MODEL, "input": messages}),
        (
            "responses tool parameters",
            "responses",
            {
                "model": MODEL,
                "input": "hi",
                "tools": [{"type": "function", "name": "f", "parameters": schema}],
            },
        ),
        (
            "messages content blocks",
            "messages",
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": parts}]},
        ),
        (
            "messages tool input_schema",
            "messages",
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "f", "input_schema": schema}],
            },
        ),
        (
            "messages tool_use input",
            "messages",
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "t", "name": "f", "input": tool_input}
                        ],
                    },
                ],
            },
        ),
    ]


@pytest.mark.parametrize(
    ("protocol", "body"),
    [pytest.param(p, b, id=name) for name, p, b in circular_bodies()],
)
def test_circular_reference_in_fields(protocol, body):
    mine, theirs = both(protocol, body)
    assert_same(mine, theirs)
    error = mine.get("construct")
    assert error is not None, S.outcome_label(mine)
    assert error["error"] == "ValueError", error
    assert "circular reference" in error["message"], error


# ---------------------------------------------------------------------------------------------
# invalid text in content

BAD_UTF8 = {
    "0xff": b"\xff",
    "overlong": b"\xc0\xaf",
    "encoded surrogate": b"\xed\xa0\x80",
    "above U+10FFFF": b"\xf4\x90\x80\x80",
    "truncated": b"\xe6\x97",
    "continuation only": b"\x80",
}


def content_body(protocol: str, content: Any) -> dict:
    if protocol == "chat":
        return {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    if protocol == "responses":
        return {"model": MODEL, "input": [{"role": "user", "content": content}]}
    return {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": content}]}


@pytest.mark.parametrize("sequence", list(BAD_UTF8.values()), ids=list(BAD_UTF8))
@pytest.mark.parametrize("protocol", S.PROTOCOLS)
def test_invalid_utf8_in_content(protocol, sequence):
    text = json.dumps(content_body(protocol, "a" + NEST + "b"))
    body = text.encode().replace(NEST.encode(), sequence)
    mine, theirs = both(protocol, body)
    assert_same(mine, theirs)
    error = mine.get("construct")
    assert error is not None, S.outcome_label(mine)
    assert error["error"] == "ValueError", error
    assert error["message"].startswith("invalid JSON request: "), error
    assert "unicode" in error["message"] or "UTF-8" in error["message"], error


@pytest.mark.parametrize("protocol", S.PROTOCOLS)
def test_lone_surrogate_in_content(protocol):
    mine, theirs = both(protocol, content_body(protocol, "a\ud800b"))
    assert_same(mine, theirs)
    error = mine.get("construct")
    assert error is not None, S.outcome_label(mine)
    assert error["error"] == "UnicodeEncodeError", error  # a ValueError
    assert "surrogates not allowed" in error["message"], error


# ---------------------------------------------------------------------------------------------
# wrong types of nested fields

TOOL_CHAT = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def wrong_type_cases() -> list[tuple[str, str, dict]]:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    responses = {"model": MODEL, "input": "hi"}
    messages = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    history_args = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
            ],
        },
    ]
    return [
        ("chat tool_choice int", "chat", dict(chat, tools=[TOOL_CHAT], tool_choice=5)),
        ("chat tool_choice unknown", "chat", dict(chat, tools=[TOOL_CHAT], tool_choice="often")),
        (
            "chat tool name int",
            "chat",
            dict(chat, tools=[{"type": "function", "function": {"name": 5}}]),
        ),
        (
            "chat tool parameters string",
            "chat",
            dict(chat, tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        ),
        ("chat stop int", "chat", dict(chat, stop=5)),
        ("chat stop ints", "chat", dict(chat, stop=[1, 2])),
        ("chat arguments object", "chat", dict(chat, tools=[TOOL_CHAT], messages=history_args)),
        (
            "chat image url int",
            "chat",
            dict(
                chat,
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}
                ],
            ),
        ),
        (
            "chat unknown part",
            "chat",
            dict(chat, messages=[{"role": "user", "content": [{"type": "video", "video": "x"}]}]),
        ),
        ("chat thinking type", "chat", dict(chat, thinking={"type": "maybe"})),
        ("chat reasoning_effort", "chat", dict(chat, reasoning_effort="extreme")),
        ("chat response_format type", "chat", dict(chat, response_format={"type": "xml"})),
        ("chat logprobs string", "chat", dict(chat, logprobs="yes")),
        ("chat seed string", "chat", dict(chat, seed="7")),
        ("chat include_usage string", "chat", dict(chat, stream_options={"include_usage": "y"})),
        ("responses effort", "responses", dict(responses, reasoning={"effort": "extreme"})),
        (
            "responses call_id int",
            "responses",
            dict(
                responses,
                input=[{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}],
            ),
        ),
        (
            "responses parameters list",
            "responses",
            dict(responses, tools=[{"type": "function", "name": "f", "parameters": []}]),
        ),
        (
            "responses json_schema without name",
            "responses",
            dict(responses, text={"format": {"type": "json_schema"}}),
        ),
        ("responses instructions int", "responses", dict(responses, instructions=5)),
        ("responses max_output_tokens string", "responses", dict(responses, max_output_tokens="5")),
        ("messages system int", "messages", dict(messages, system=5)),
        ("messages system image", "messages", dict(messages, system=[{"type": "image"}])),
        (
            "messages unknown block",
            "messages",
            dict(messages, messages=[{"role": "user", "content": [{"type": "unknown_block"}]}]),
        ),
        (
            "messages text int",
            "messages",
            dict(messages, messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
        ),
        (
            "messages input_schema string",
            "messages",
            dict(messages, tools=[{"name": "f", "input_schema": "object"}]),
        ),
        (
            "messages tool_choice without name",
            "messages",
            dict(messages, tool_choice={"type": "tool"}),
        ),
        ("messages stop_sequences string", "messages", dict(messages, stop_sequences="END")),
        (
            "messages budget_tokens string",
            "messages",
            dict(messages, thinking={"type": "enabled", "budget_tokens": "many"}),
        ),
        (
            "messages budget_tokens negative",
            "messages",
            dict(messages, thinking={"type": "enabled", "budget_tokens": -1}),
        ),
        (
            "messages budget_tokens float",
            "messages",
            dict(messages, thinking={"type": "enabled", "budget_tokens": 1.5}),
        ),
        (
            "messages budget_tokens with thinking disabled",
            "messages",
            dict(messages, thinking={"type": "disabled", "budget_tokens": "x"}),
        ),
        (
            "messages disable_parallel_tool_use string",
            "messages",
            dict(messages, tool_choice={"type": "auto", "disable_parallel_tool_use": "x"}),
        ),
        (
            "messages is_error string",
            "messages",
            dict(
                messages,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": "x",
                                "is_error": "yes",
                            }
                        ],
                    }
                ],
            ),
        ),
    ]


@pytest.mark.parametrize(
    ("protocol", "body"),
    [pytest.param(p, b, id=name) for name, p, b in wrong_type_cases()],
)
def test_wrong_nested_types(protocol, body):
    """Rejected as the official rejects them: the same exception type and message (serde's
    wording: the offending value and the expected type; like the official, the message does
    not give the field's path)."""
    mine, theirs = both(protocol, body)
    assert_same(mine, theirs)
    error = rejection(mine)
    assert error is not None, S.outcome_label(mine)
    assert error["error"] in ("ValueError", "ConversionError"), error
    message = error["message"]
    assert any(w in message for w in ("expected", "missing field", "Invalid schema")), error


# ---------------------------------------------------------------------------------------------
# a 10 MB content, rendered and encoded

BIG = ("The quick brown fox jumps over the lazy dog. 你好世界 ✓\n" * 200_000)[: 10 * 1024 * 1024]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", S.PROTOCOLS)
def test_10mb_content_encodes_like_the_official(protocol, tokenizers):
    """Conversion and rendering of a 10 MB body are covered by `test_huge_body`; here the
    prompt is also encoded (about 4 s for ours on two cores, so: slow tier)."""
    body = content_body(protocol, BIG)

    def run(M):
        converted = getattr(M, S.REQUEST_CLASS[protocol])(body).convert(M.ConversionOptions())
        encoding = M.DeepseekV41Encoding()
        rendered = encoding.render_conversation(converted.conversation)
        ids = encoding.with_tokenizer(tokenizers[M]).encode(converted.conversation)
        return rendered.prompt, list(rendered.special_ranges), list(ids)

    start = time.perf_counter()
    mine = run(ours)
    elapsed = time.perf_counter() - start
    theirs = run(official)
    assert BIG in mine[0]
    assert mine[0] == theirs[0]
    assert mine[1] == theirs[1]
    assert mine[2] == theirs[2]
    assert elapsed < 30, f"{elapsed:.1f}s to convert, render and encode 10 MB"
