"""Request fields over HTTP through the official SDKs (issue 26, "no silent drops" and
"Responses interop"): unknown and unserved fields are 400s the SDKs parse, in each API's shape
and naming the field; Responses objects report what was served (text.verbosity "medium",
metadata, parallel_tool_calls); a forced function call is a complete call; Messages
tool_choice any calls a tool. tests/engine/test_request_fields.py covers every field."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}},
    "required": ["city"],
    "additionalProperties": False,
}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": PARAMS}
NO_REASONING = {"effort": "none"}


def test_openai_refusals_name_the_field(openai_client):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(**chat, extra_body={"frobnicate": 1})
    assert e.value.body["message"] == "Unrecognized request argument supplied: frobnicate"
    assert e.value.param == "frobnicate"
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.responses.create(model="tiny", input="hi", previous_response_id="resp_1")
    assert e.value.body["message"] == "Previous response with id 'resp_1' not found."
    assert (e.value.param, e.value.code) == ("previous_response_id", "previous_response_not_found")
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.responses.create(
            model="tiny", input="hi", extra_body={"max_output_tokens": 16.0}
        )
    assert e.value.body["message"] == (
        "Invalid type for 'max_output_tokens': expected an integer, but got a decimal number "
        "instead."
    )
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    with pytest.raises(openai.BadRequestError, match="the served model has no vision encoder") as e:
        openai_client.responses.create(
            model="tiny", input=[{"role": "user", "content": [image]}], max_output_tokens=4
        )
    assert e.value.param == "input[0].content[0]"


def test_responses_objects_report_what_was_served(openai_client):
    r = openai_client.responses.create(
        model="tiny",
        input="Weather?",
        tools=[RESPONSES_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        metadata={"team": "a"},
        reasoning=NO_REASONING,
        max_output_tokens=120,
        temperature=1.0,
    )
    assert r.text.verbosity == "medium"
    assert (r.metadata, r.parallel_tool_calls) == ({"team": "a"}, False)
    # The forced call is complete and valid (the grammar), and only one (parallel off).
    calls = [item for item in r.output if item.type == "function_call"]
    assert r.status == "completed", r.incomplete_details
    assert len(calls) == 1
    assert calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), PARAMS)


def test_anthropic_refusals_have_its_shape(anthropic_client):
    base = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic_client.messages.create(**base, extra_body={"frobnicate": 1})
    assert e.value.body["type"] == "error"
    assert e.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "frobnicate: Extra inputs are not permitted",
    }
    block = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                            "data": "x"}}  # fmt: skip
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.content\.0: document"):
        anthropic_client.messages.create(
            **{**base, "messages": [{"role": "user", "content": [block]}]}
        )


def test_anthropic_tool_choice_any_calls_a_tool(anthropic_client):
    tool = {"name": "get_weather", "input_schema": PARAMS}
    m = anthropic_client.messages.create(
        model="tiny",
        max_tokens=120,
        messages=[{"role": "user", "content": "Weather?"}],
        thinking={"type": "disabled"},
        tools=[tool],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use"
    assert len(uses) == 1
    jsonschema.validate(uses[0].input, PARAMS)
