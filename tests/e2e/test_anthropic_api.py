"""Messages through the official `anthropic` SDK against `deepring serve`."""

from __future__ import annotations

import anthropic
import httpx2
import pytest

# Generation takes only JSON bodies (415 otherwise): malformed ones must still say so.
JSON = {"content-type": "application/json"}

MESSAGES = [{"role": "user", "content": "Describe a mountain."}]


# This SDK version has no `temperature` argument; the API still takes it.
GREEDY = {"extra_body": {"temperature": 0}}


def _create(client, **kw):
    args = {
        "model": "tiny",
        "max_tokens": 12,
        "messages": MESSAGES,
        "thinking": {"type": "disabled"},
        **GREEDY,
        **kw,
    }
    return client.messages.create(**args)


def _text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_messages_streamed_and_not_agree(anthropic_client):
    full = _create(anthropic_client)
    assert full.type == "message"
    assert full.role == "assistant"
    assert full.stop_reason == "max_tokens"
    assert full.usage.output_tokens == 12
    assert full.usage.input_tokens > 0
    args = {
        "model": "tiny",
        "max_tokens": 12,
        "messages": MESSAGES,
        "thinking": {"type": "disabled"},
        **GREEDY,
    }
    with anthropic_client.messages.stream(**args) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == _text(full)
    assert _text(final) == _text(full)
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12


def test_messages_thinking_block(anthropic_client):
    kw = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 8}
    full = _create(anthropic_client, **kw)
    assert full.content[0].type == "thinking"
    assert full.content[0].signature


def test_messages_thinking_budget_ends_the_reasoning(anthropic_client):
    """With budget_tokens 3 the reasoning stops after 3 tokens and an answer follows (without
    a budget the tiny model reasons until max_tokens); the same streamed. Thinking mode ignores
    temperature (as Anthropic's API does): a seed makes the draws repeatable."""
    seeded = {"extra_body": {"seed": 7}}
    unbounded = {"thinking": {"type": "enabled", "budget_tokens": 1024}, **seeded}
    # Twice: the reference and the request below then both start from the cached prompt.
    _create(anthropic_client, **unbounded)
    free = _create(anthropic_client, **unbounded)
    assert [b.type for b in free.content] == ["thinking"]  # the reference: still thinking
    kw = {"thinking": {"type": "enabled", "budget_tokens": 3}, **seeded}
    full = _create(anthropic_client, **kw)
    assert [b.type for b in full.content] == ["thinking", "text"]
    assert free.content[0].thinking.startswith(full.content[0].thinking)
    assert full.usage.output_tokens == 12
    with anthropic_client.messages.stream(
        model="tiny", max_tokens=12, messages=MESSAGES, **kw
    ) as stream:
        final = stream.get_final_message()
    assert [b.model_dump(exclude={"signature"}) for b in final.content] == [
        b.model_dump(exclude={"signature"}) for b in full.content
    ]  # (a signature names its response)


def test_messages_with_tools_declared(anthropic_client):
    tools = [
        {
            "name": "get_weather",
            "description": "Weather for a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    full = _create(anthropic_client, tools=tools, max_tokens=16)
    assert full.stop_reason in ("max_tokens", "end_turn", "tool_use")
    with anthropic_client.messages.stream(
        model="tiny",
        max_tokens=16,
        messages=MESSAGES,
        thinking={"type": "disabled"},
        tools=tools,
        **GREEDY,
    ) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in full.content]


def test_errors_have_the_anthropic_shape(anthropic_client, base_url):
    with pytest.raises(anthropic.BadRequestError) as e:
        _create(anthropic_client, model="claude-nope")
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "claude-nope" in e.value.body["error"]["message"]
    r = httpx2.post(f"{base_url}/v1/messages", content=b"[1, 2", headers=JSON, timeout=30)
    assert r.status_code == 400
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx2.post(f"{base_url}/v1/messages", content=b" " * 300_000, timeout=30)
    assert r.status_code == 413
    assert r.json() == {
        "type": "error",
        "error": {"type": "request_too_large", "message": r.json()["error"]["message"]},
    }
