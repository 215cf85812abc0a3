"""Sampling fields and log probabilities over HTTP (`deepring serve`, the tiny model): streamed
and non-streamed responses agree, log probabilities included, in Chat Completions and
Responses; the vLLM-style fields are honoured; what cannot be honoured is a 400 naming the
field, in each API's error shape."""

from __future__ import annotations

import json

import httpx2
import pytest

NO_THINKING = {"thinking": {"type": "disabled"}}
JSON = {"content-type": "application/json"}


def _chat(client, stream: bool, **kw):
    args = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me about rivers."}],
        "max_tokens": 12,
        "temperature": 0,
        **kw,
    }
    args["extra_body"] = {**NO_THINKING, **args.get("extra_body", {})}
    return client.chat.completions.create(stream=stream, **args)


def _entries(content) -> list[dict]:
    return [c.model_dump() for c in content or []]


def _streamed(client, **kw) -> tuple[str, list[dict]]:
    text, lps = "", []
    for chunk in _chat(client, stream=True, **kw):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                lps += _entries(choice.logprobs.content)
    return text, lps


SAMPLING = [
    {"temperature": 0},
    {"temperature": 0.9, "seed": 11, "top_p": 0.95,
     "extra_body": {"top_k": 50, "min_p": 0.01}},
    {"temperature": 0.8, "seed": 3, "frequency_penalty": 1.0, "presence_penalty": -0.5},
]  # fmt: skip


@pytest.mark.parametrize("kw", SAMPLING)
def test_chat_logprobs_streamed_and_not_agree(openai_client, kw):
    full = _chat(openai_client, stream=False, logprobs=True, top_logprobs=4, **kw)
    choice = full.choices[0]
    lps = _entries(choice.logprobs.content)
    assert len(lps) == full.usage.completion_tokens == 12
    for e in lps:
        assert e["logprob"] <= 0
        tops = e["top_logprobs"]
        assert len(tops) == 4
        values = [t["logprob"] for t in tops]
        assert values == sorted(values, reverse=True)
        # The sampled token is listed among the alternatives when it ranks among them.
        if e["logprob"] > values[-1]:
            assert {"token": e["token"], "logprob": e["logprob"]} in [
                {"token": t["token"], "logprob": t["logprob"]} for t in tops
            ]
        if kw["temperature"] == 0 and "frequency_penalty" not in kw:
            assert e["logprob"] == values[0]  # greedy takes the most likely
    text, streamed = _streamed(openai_client, logprobs=True, top_logprobs=4, **kw)
    assert text == choice.message.content
    assert streamed == lps


def test_chat_without_logprobs_has_none_and_the_same_text(openai_client):
    kw = SAMPLING[1]
    plain = _chat(openai_client, stream=False, **kw).choices[0]
    with_lp = _chat(openai_client, stream=False, logprobs=True, **kw).choices[0]
    assert plain.logprobs is None
    assert plain.message.content == with_lp.message.content
    assert all(e["top_logprobs"] == [] for e in _entries(with_lp.logprobs.content))


def _responses_sse(base_url: str, body: dict) -> list[tuple[str, dict]]:
    r = httpx2.post(f"{base_url}/v1/responses", json={**body, "stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    events = []
    for block in r.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            events.append((lines.get("event", ""), json.loads(lines["data"])))
    return events


@pytest.mark.parametrize(
    "ask", [{"top_logprobs": 3}, {"include": ["message.output_text.logprobs"]}]
)
def test_responses_logprobs_streamed_and_not_agree(base_url, ask):
    body = {
        "model": "tiny",
        "input": "Name three rivers.",
        "max_output_tokens": 10,
        "temperature": 0.7,
        "seed": 5,
        "reasoning": {"effort": "none"},
        **ask,
    }
    full = httpx2.post(f"{base_url}/v1/responses", json=body, timeout=120).json()
    part = next(o for o in full["output"] if o["type"] == "message")["content"][0]
    k = ask.get("top_logprobs", 0)
    assert len(part["logprobs"]) == full["usage"]["output_tokens"] == 10
    assert all(len(e["top_logprobs"]) == k for e in part["logprobs"])
    events = _responses_sse(base_url, body)
    deltas = [d for name, d in events if name == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == part["text"]
    assert [e for d in deltas for e in d["logprobs"]] == part["logprobs"]
    done = next(d for name, d in events if name == "response.output_text.done")
    assert done["logprobs"] == part["logprobs"]


def _error(base_url: str, path: str, body: dict) -> dict:
    r = httpx2.post(f"{base_url}{path}", content=json.dumps(body), headers=JSON, timeout=60)
    assert r.status_code == 400, r.text
    return r.json()


@pytest.mark.parametrize(
    ("field", "value"),
    [("repetition_penalty", 1.3), ("logit_bias", {"42": 5}), ("min_tokens", 2),
     ("top_k", "many"), ("min_p", 3), ("stop_token_ids", "eos")],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused_by_name(base_url, field, value):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], field: value}
    err = _error(base_url, "/v1/chat/completions", chat)["error"]
    assert err["param"] == field
    assert field in err["message"]
    msgs = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    err = _error(base_url, "/v1/messages", {**msgs, field: value})
    assert err["type"] == "error"
    assert field in err["error"]["message"]


def test_messages_has_no_logprobs_and_honours_top_k(anthropic_client, base_url):
    msgs = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    err = _error(base_url, "/v1/messages", {**msgs, "logprobs": True})
    assert "logprobs" in err["error"]["message"]

    def text(temperature: float) -> str:
        extra = {"thinking": {"type": "disabled"}, "temperature": temperature, "top_k": 1}
        m = [{"role": "user", "content": "hi"}]
        r = anthropic_client.messages.create(model="tiny", max_tokens=8, messages=m,
                                             extra_body=extra)  # fmt: skip
        return r.content[0].text

    a, b = text(1.0), text(0.3)
    # top_k 1 keeps only the most likely token: the temperature no longer matters.
    assert a == b


def test_seeded_sampling_with_every_field_repeats_exactly(openai_client):
    kw = {"temperature": 1.0, "seed": 99, "presence_penalty": 0.5, "frequency_penalty": 0.5,
          "extra_body": {"top_k": 100, "min_p": 0.001, "stop_token_ids": [0]}}  # fmt: skip
    a = _chat(openai_client, stream=False, **kw).choices[0].message.content
    b = _chat(openai_client, stream=False, **kw).choices[0].message.content
    c = _chat(openai_client, stream=False, **{**kw, "seed": 100}).choices[0].message.content
    assert a == b
    assert a != c
