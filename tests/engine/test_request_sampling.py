"""A request body's sampling fields to SamplingParams (protocol.sampling): each field honoured
on the APIs that serve it, a refusal naming the field for anything else, the same result for
bytes, text and dict bodies, and deepring_recipe.request_fields reading only top-level fields."""

from __future__ import annotations

import json

import pytest
from deepring.protocol.errors import ApiError
from deepring.protocol.formats import PromptFormat
from deepring.protocol.prepare import CHAT, MESSAGES, RESPONSES, Recipe
from deepring_recipe import request_fields

BODIES = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"model": "m", "input": "hi"},
    MESSAGES: {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]},
}
APIS = list(BODIES)


@pytest.fixture(scope="module")
def recipe(v41_tokenizer_path):
    return Recipe(v41_tokenizer_path, ["m"], PromptFormat.V4, default_thinking=False)


def _params(recipe, api, **fields):
    body = {**BODIES[api], **fields}
    text = json.dumps(body)
    preps = [recipe.prepare(api, b, 4096) for b in (body, text, text.encode())]
    assert preps[0].params == preps[1].params == preps[2].params
    return preps[0]


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_sampling_extensions_are_honoured_on_every_api(recipe, api):
    fields = {
        "top_k": 7, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -1,
        "stop_token_ids": [5, 9], "ignore_eos": True, "temperature": 0.7, "top_p": 0.9,
        "repetition_penalty": 1.0, "min_tokens": 0, "logit_bias": {}, "seed": 1234,
    }  # fmt: skip
    prep = _params(recipe, api, **fields)
    p = prep.params
    assert (p.top_k, p.min_p, p.presence_penalty, p.frequency_penalty) == (7, 0.05, 0.5, -1.0)
    assert (p.stop_token_ids, p.ignore_eos, p.seed, prep.seed) == ((5, 9), True, 1234, 1234)
    assert p.temperature == pytest.approx(0.7)
    assert p.top_p == pytest.approx(0.9)
    assert p.max_tokens == (9 if api is MESSAGES else p.max_tokens)
    assert p.logprobs is None


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_defaults_and_nulls_change_nothing(recipe, api):
    nulls = {k: None for k in ("top_k", "min_p", "stop_token_ids", "presence_penalty",
                               "frequency_penalty", "ignore_eos", "logit_bias")}  # fmt: skip
    a = _params(recipe, api).params
    b = _params(recipe, api, **nulls).params
    assert a == b
    assert (a.top_k, a.min_p, a.presence_penalty, a.frequency_penalty) == (-1, 0.0, 0.0, 0.0)
    assert _params(recipe, api, top_k=0).params.top_k == -1  # vLLM: 0 and -1 mean off


def test_logprobs_per_api(recipe):
    assert _params(recipe, CHAT, logprobs=True).params.logprobs == 0
    assert _params(recipe, CHAT, logprobs=True, top_logprobs=5).params.logprobs == 5
    assert _params(recipe, CHAT, logprobs=False).params.logprobs is None
    # Responses: top_logprobs (the recipe turns logprobs on with it) or OpenAI's include.
    assert _params(recipe, RESPONSES, top_logprobs=3).params.logprobs == 3
    inc = ["message.output_text.logprobs"]
    assert _params(recipe, RESPONSES, include=inc).params.logprobs == 0
    other = ["reasoning.encrypted_content"]
    assert _params(recipe, RESPONSES, include=other).params.logprobs is None
    assert _params(recipe, MESSAGES, logprobs=False).params.logprobs is None


def _refused(recipe, api, field, value):
    body = {**BODIES[api], field: value}
    with pytest.raises(ApiError) as err:
        recipe.prepare(api, json.dumps(body), 4096)
    e = err.value
    assert e.status == 400
    assert field in e.message
    assert json.loads(e.body("/v1/chat/completions"))["error"]["param"] == field
    return e.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", -2), ("top_k", 1.5), ("top_k", "5"), ("top_k", True), ("top_k", 2**31),
        ("min_p", 1.5), ("min_p", -0.1), ("min_p", "0.1"),
        ("presence_penalty", 2.5), ("frequency_penalty", -2.01), ("frequency_penalty", [1]),
        ("stop_token_ids", [1, -2]), ("stop_token_ids", 5), ("stop_token_ids", [1.0]),
        ("stop_token_ids", list(range(4097))),
        ("ignore_eos", 1), ("repetition_penalty", 1.1), ("min_tokens", 3),
        ("logit_bias", {"5": 10}), ("repetition_penalty", True),
    ],
)  # fmt: skip
def test_bad_or_unsupported_fields_are_refused_by_name(recipe, field, value):
    for api in APIS:
        if api is CHAT and field in ("presence_penalty", "frequency_penalty"):
            # The recipe reads Chat's penalties itself, and refuses them with the official
            # messages (a wrong type's is serde's, which does not name the field).
            with pytest.raises(ApiError) as err:
                recipe.prepare(api, {**BODIES[api], field: value}, 4096)
            assert err.value.status == 400
            continue
        _refused(recipe, api, field, value)


@pytest.mark.parametrize(
    ("api", "field", "value"),
    [
        (MESSAGES, "logprobs", True), (MESSAGES, "top_logprobs", 2), (MESSAGES, "seed", -1),
        (RESPONSES, "seed", 2**63), (RESPONSES, "include", "message.output_text.logprobs"),
    ],
)  # fmt: skip
def test_per_api_refusals(recipe, api, field, value):
    _refused(recipe, api, field, value)


def test_request_fields_reads_top_level_fields_only():
    body = {"model": "m", "messages": [{"role": "user", "content": "x", "top_k": 3}], "min_p": 0.5}
    names = ["top_k", "min_p"]
    want = {"min_p": 0.5}
    assert request_fields(body, names) == want
    assert request_fields(json.dumps(body), names) == want
    assert request_fields(json.dumps(body).encode(), names) == want
    # Escaped keys are the fields they spell, the last repeat wins, as serde reads them.
    assert request_fields(b'{"top\\u005fk": 1, "top_k": 2, "x": {"top_k": 3}}', names) == {
        "top_k": 2
    }
    big = json.dumps({**body, "pad": "x" * (1 << 20), "top_k": 4})
    assert request_fields(big, names) == {"min_p": 0.5, "top_k": 4}
    with pytest.raises(ValueError, match="invalid JSON request"):
        request_fields(b'{"top_k": ', names)


def test_a_stop_token_id_ends_the_text_without_being_part_of_it(recipe):
    from deepring.protocol.output import ready_events, token_events

    hello = recipe.tokenizer.encode("Hello there")
    stop = recipe.tokenizer.encode(" general")[0]
    prep = _params(recipe, CHAT, stop_token_ids=[stop], logprobs=True)
    resp = CHAT.response(prep.response_id, prep.model, prep.created, len(prep.prompt_ids), 0)
    lps = [(-0.5, [])] * (len(hello) + 1)
    events = ready_events(prep, 0)
    more, over = token_events(prep, [*hello, stop], "stop", frozenset({1}), lps)
    assert over
    for e in events + more:
        resp.accumulate(e)
    body = json.loads(resp.to_json())
    assert body["choices"][0]["message"]["content"] == "Hello there"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert len(body["choices"][0]["logprobs"]["content"]) == len(hello)
