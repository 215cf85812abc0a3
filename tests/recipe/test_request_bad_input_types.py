"""Wrong types of nested fields, per protocol, deepring_recipe against the official wheel.

Helpers and background: `bad_input.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bad_input import MODEL, assert_same, both, rejection

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import summary as S

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
