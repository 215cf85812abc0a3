"""Circular references inside the request's own fields (messages, content parts, schemas,
Responses input, Messages tool input), deepring_recipe against the official wheel.

Helpers and background: `bad_input.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from bad_input import MODEL, assert_same, both

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import summary as S


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
