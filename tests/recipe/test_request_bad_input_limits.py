"""Bad request input at and past the limits, deepring_recipe against the official wheel:
nesting at and past the depth limit inside values conversion keeps and walks, deep JSON
inside tool-call `arguments`, and a 10 MB content rendered and encoded (slow tier).

Helpers and background: `bad_input.py`.
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
from bad_input import MODEL, NEST, assert_same, both, content_body

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import summary as S


@pytest.fixture(scope="module")
def tokenizers(v41_tokenizer_path):
    path = str(v41_tokenizer_path)
    return {
        ours: ours.Tokenizer.from_file(path),
        official: official.Tokenizer.from_file(path),
    }


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
