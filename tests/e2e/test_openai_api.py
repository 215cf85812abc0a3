"""Chat Completions and Responses through the official `openai` SDK against `deepring serve`
(the tiny model: random weights, so the text is noise, but deterministic under greedy
sampling, which is what lets streamed and non-streamed results be compared)."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

# Generation takes only JSON bodies (415 otherwise): malformed ones must still say so.
JSON = {"content-type": "application/json"}

NO_THINKING = {"thinking": {"type": "disabled"}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]


def _chat(client, stream: bool, **kw):
    args = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me about rivers."}],
        "max_tokens": 12,
        "temperature": 0,
        "extra_body": NO_THINKING,
        **kw,
    }
    return client.chat.completions.create(stream=stream, **args)


def _collect(stream) -> dict:
    out = {
        "content": "",
        "reasoning": "",
        "finish": None,
        "usage": None,
        "tool_calls": {},
        "ids": set(),
    }
    for chunk in stream:
        out["ids"].add(chunk.id)
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            out["content"] += d.content or ""
            out["reasoning"] += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                slot = out["tool_calls"].setdefault(tc.index, {"name": "", "arguments": ""})
                if tc.function and tc.function.name:
                    slot["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            if choice.finish_reason is not None:
                out["finish"] = choice.finish_reason
    return out


def test_models_lists_the_served_model(openai_client):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    # It says what the default model is: random weights, so random output.
    assert "random weights" in models.data[0].model_extra["description"]


def test_thinking_is_off_by_default_for_a_random_weight_model(openai_client):
    """tiny never closes its reasoning, so with thinking on by default its answers would be
    all reasoning and no content: the server defaults thinking off for it."""
    full = openai_client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    assert full.choices[0].message.content
    assert not full.choices[0].message.model_extra.get("reasoning_content")


def test_a_request_without_max_tokens_gets_the_random_model_cap(openai_client):
    """tiny never ends an answer by itself: without a limit of its own a request stops at the
    server's cap for random-weight models (256), not at the context length."""
    full = openai_client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=0
    )
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 256


@pytest.mark.parametrize("name", ["DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash", "gpt-4o"])
def test_only_the_served_model_names_are_accepted(openai_client, name):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert name in e.value.message
    assert "tiny" in e.value.message


def test_chat_streamed_and_not_agree(openai_client):
    full = _chat(openai_client, stream=False)
    msg = full.choices[0]
    assert full.object == "chat.completion"
    assert full.model == "tiny"
    assert msg.finish_reason == "length"
    assert msg.message.content
    assert full.usage.completion_tokens == 12
    assert full.usage.prompt_tokens > 0
    assert full.usage.model_extra["prompt_cache_hit_tokens"] == 0
    streamed = _collect(_chat(openai_client, stream=True))
    assert streamed["content"] == msg.message.content
    assert streamed["finish"] == "length"
    assert len(streamed["ids"]) == 1
    assert streamed["usage"].completion_tokens == 12
    assert streamed["usage"].prompt_tokens == full.usage.prompt_tokens
    assert streamed["usage"].model_extra["prompt_cache_hit_tokens"] == 0


def test_chat_thinking_mode_streams_reasoning(openai_client):
    # Thinking samples at temperature 1: a seed makes it repeatable.
    kw = {"extra_body": {"thinking": {"type": "enabled"}}, "max_tokens": 10, "seed": 7}
    full = _chat(openai_client, stream=False, **kw)
    reasoning = full.choices[0].message.model_extra.get("reasoning_content")
    streamed = _collect(_chat(openai_client, stream=True, **kw))
    assert streamed["reasoning"] == reasoning
    assert streamed["content"] == (full.choices[0].message.content or "")
    assert streamed["usage"].completion_tokens == full.usage.completion_tokens == 10
    assert reasoning


def test_chat_with_tools_declared(openai_client):
    kw = {"tools": TOOLS, "max_tokens": 16}
    full = _chat(openai_client, stream=False, **kw)
    streamed = _collect(_chat(openai_client, stream=True, **kw))
    choice = full.choices[0]
    assert choice.finish_reason in ("length", "stop", "tool_calls")
    assert streamed["finish"] == choice.finish_reason
    assert streamed["content"] == (choice.message.content or "")
    calls = [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in choice.message.tool_calls or []
    ]
    assert [streamed["tool_calls"][i] for i in sorted(streamed["tool_calls"])] == calls


def test_chat_stop_sequence_ends_the_request(openai_client, server):
    text = _chat(openai_client, stream=False, max_tokens=24).choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"no usable stop string in {text!r}"
    want = text[: text.index(stop)]
    full = _chat(openai_client, stream=False, max_tokens=24, stop=[stop])
    assert full.choices[0].message.content == want
    assert full.choices[0].finish_reason == "stop"
    streamed = _collect(_chat(openai_client, stream=True, max_tokens=24, stop=[stop]))
    assert streamed["content"] == want
    assert streamed["finish"] == "stop"
    assert server.health()["requests_in_flight"] == 0


def test_sse_framing(base_url):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 5,
        **NO_THINKING,
    }
    with httpx2.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == ""  # the stream ends with a complete event
    events = events[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_responses_streamed_and_not_agree(openai_client):
    kw = {
        "model": "tiny",
        "input": "Name three rivers.",
        "max_output_tokens": 12,
        "temperature": 0,
        "reasoning": {"effort": "none"},
    }
    full = openai_client.responses.create(**kw)
    assert full.status == "incomplete"  # max_output_tokens reached
    assert full.usage.output_tokens == 12
    deltas, final = [], None
    with openai_client.responses.create(stream=True, **kw) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert "".join(deltas) == full.output_text
    assert final is not None
    assert final.output_text == full.output_text
    assert final.usage.output_tokens == 12


def test_responses_with_tools_declared(openai_client):
    tools = [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ]
    r = openai_client.responses.create(
        model="tiny", input="Look up rivers.", tools=tools, max_output_tokens=8, temperature=0
    )
    assert r.usage.output_tokens <= 8
    assert r.tools[0].name == "lookup"


def test_errors_have_the_openai_shape(openai_client, base_url):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.status_code == 400
    assert "gpt-4o" in e.value.message
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        openai_client.responses.create(model="tiny", input="hi", temperature=5)
    # Malformed JSON, a body over the limit, an unknown route, a wrong method.
    r = httpx2.post(
        f"{base_url}/v1/chat/completions", content=b"{not json", headers=JSON, timeout=30
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx2.post(f"{base_url}/v1/chat/completions", content=b" " * 300_000, timeout=30)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    r = httpx2.get(f"{base_url}/v1/nothing", timeout=30)
    assert r.status_code == 404
    assert "error" in r.json()
    r = httpx2.get(f"{base_url}/v1/chat/completions", timeout=30)
    assert r.status_code == 405


def test_context_length_is_checked(openai_client):
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        openai_client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1020
        )
