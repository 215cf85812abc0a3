"""Structured output over HTTP (issue 26): response_format json_schema / regex and tool_choice
required through the official `openai` SDK against `deepring serve` (the tiny random model:
only the grammar makes its output JSON or a tool call). Every answer is checked by an
independent validator, streamed and not; a schema llguidance cannot compile is a 400."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

NO_THINKING = {"thinking": {"type": "disabled"}}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
        },
    },
}


def _create(client, stream: bool, **kw):
    args = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Answer in json."}],
        "max_tokens": 200,
        "extra_body": NO_THINKING,
        **kw,
    }
    out = client.chat.completions.create(stream=stream, **args)
    if not stream:
        choice = out.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
        return choice.message.content or "", calls, choice.finish_reason
    content, calls, finish = "", {}, None
    for chunk in out:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for c in choice.delta.tool_calls or ():
                name, args_ = calls.get(c.index, ("", ""))
                calls[c.index] = (
                    name + (c.function.name or ""),
                    args_ + (c.function.arguments or ""),
                )
            finish = choice.finish_reason or finish
    return content, list(calls.values()), finish


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_json_schema_answers_validate(openai_client, stream, temperature):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    content, _, finish = _create(
        openai_client, stream, response_format=fmt, temperature=temperature, seed=5
    )
    assert finish == "stop"
    jsonschema.validate(json.loads(content), SCHEMA)


def test_regex_answers_match(openai_client):
    regex = "[a-z]{2,4}-[0-9]{2}"
    fmt = {"type": "regex", "regex": regex}
    content, _, finish = _create(openai_client, False, response_format=fmt, temperature=1.0)
    assert finish == "stop"
    assert re.fullmatch(regex, content), content


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_required_tool_calls_are_well_formed_and_valid(openai_client, stream):
    _, calls, finish = _create(
        openai_client, stream, tools=[TOOL], tool_choice="required", temperature=1.0, seed=3
    )
    if finish == "length":
        # A random model may chain invokes until max_tokens: the last one can be cut short.
        calls = calls[:-1]
    else:
        assert finish == "tool_calls"
    assert calls
    for name, args in calls:
        assert name == "get_weather"
        jsonschema.validate(json.loads(args), TOOL["function"]["parameters"])


def test_a_schema_that_cannot_be_enforced_is_a_400(openai_client):
    schema = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as e:
        _create(openai_client, False, response_format=fmt)
    assert "uniqueItems" in str(e.value)


OTHER = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string", "maxLength": 5}},
            "required": ["q"],
        },
    },
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_allowed_tools_only_calls_the_allowed_tool(openai_client, stream):
    """Both tools are declared (and shown to the model); only `lookup` may be called."""
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "lookup"}}],
        },
    }
    for seed in (1, 2, 3):
        _, calls, finish = _create(
            openai_client, stream, tools=[TOOL, OTHER], tool_choice=choice, temperature=1.0,
            seed=seed,
        )  # fmt: skip
        if finish == "length":
            calls = calls[:-1]  # (a chain of invokes cut at max_tokens)
        assert calls
        for name, args in calls:
            assert name == "lookup"
            jsonschema.validate(json.loads(args), OTHER["function"]["parameters"])


def test_responses_allowed_tools(openai_client):
    tools = [{"type": "function", **t["function"]} for t in (TOOL, OTHER)]
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "function", "name": "get_weather"}]}  # fmt: skip
    out = openai_client.responses.create(
        model="tiny", input="Weather?", tools=tools, tool_choice=choice, temperature=1.0,
        max_output_tokens=200, extra_body={"reasoning": {"effort": "none"}} | {},
    )  # fmt: skip
    calls = [item for item in out.output if item.type == "function_call"]
    assert calls
    assert {c.name for c in calls} == {"get_weather"}
