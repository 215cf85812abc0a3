"""The protocol layer (deepring.protocol) without a server: which model names are served and
with which template, the output cap of requests without max_tokens, the default thinking mode,
and a stock V4 tokenizer, which the V4 template serves and the V4.1 one cannot, and the two
context-length checks (the bound before encoding, and room for at least one output token)."""

from __future__ import annotations

import json

import pytest
from deepring.protocol.errors import ApiError
from deepring.protocol.formats import PromptFormat
from deepring.protocol.prepare import CHAT, MESSAGES, RESPONSES, Recipe, _prompt_chars
from deepring.protocol.tokenizer import v4_tokenizer_json_path

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def recipe(v41_tokenizer_path):
    return Recipe(v41_tokenizer_path, ["m", "alias"], PromptFormat.V41)


def test_served_names_and_only_those_are_accepted(recipe):
    assert recipe.prepare(CHAT, {**BODY, "model": "alias"}, 4096).model == "alias"
    for name in ("DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash", "other"):
        with pytest.raises(ApiError) as err:
            recipe.prepare(CHAT, {**BODY, "model": name}, 4096)
        assert err.value.status == 400
        assert name in err.value.message
        assert "m, alias" in err.value.message or "alias, m" in err.value.message


def test_every_served_name_renders_with_the_model_family_template(v41_tokenizer_path):
    v4 = Recipe(v41_tokenizer_path, ["m"], PromptFormat.V4)
    v41 = Recipe(v41_tokenizer_path, ["m"], PromptFormat.V41)
    system = {**BODY, "messages": [{"role": "system", "content": "S"}, *BODY["messages"]]}
    system_id = v41.tokenizer.token_to_id("<｜System｜>")
    assert system_id not in v4.encode(CHAT, system)
    assert system_id in v41.encode(CHAT, system)


def test_the_default_cap_applies_only_where_the_request_sets_no_limit(v41_tokenizer_path):
    capped = Recipe(v41_tokenizer_path, ["m"], PromptFormat.V4, default_max_tokens=50)
    plain = Recipe(v41_tokenizer_path, ["m"], PromptFormat.V4)
    assert capped.prepare(CHAT, BODY, 4096).params.max_tokens == 50
    # Without a cap the protocol's default, up to the context left.
    n = len(plain.encode(CHAT, BODY))
    assert plain.prepare(CHAT, BODY, 4096).params.max_tokens == 4096 - n
    assert capped.prepare(CHAT, {**BODY, "max_tokens": 70}, 4096).params.max_tokens == 70
    body = {"model": "m", "input": "hi"}
    assert capped.prepare(RESPONSES, body, 4096).params.max_tokens == 50
    assert (
        capped.prepare(RESPONSES, {**body, "max_output_tokens": 90}, 4096).params.max_tokens == 90
    )
    msgs = {**BODY, "max_tokens": 80}  # Messages always says
    assert capped.prepare(MESSAGES, msgs, 4096).params.max_tokens == 80
    with pytest.raises(ValueError, match="default_max_tokens"):
        Recipe(v41_tokenizer_path, ["m"], PromptFormat.V4, default_max_tokens=0)


@pytest.mark.parametrize("default", [True, False])
def test_default_thinking_decides_what_an_unset_request_gets(v41_tokenizer_path, default):
    r = Recipe(v41_tokenizer_path, ["m"], PromptFormat.V4, default_thinking=default)
    think = r.tokenizer.token_to_id("<think>")
    ids = r.encode(CHAT, BODY)
    assert (ids[-1] == think) is default
    off = {**BODY, "thinking": {"type": "disabled"}}
    assert r.encode(CHAT, off)[-1] == r.tokenizer.token_to_id("</think>")


def test_the_stock_v4_tokenizer_serves_the_v4_template_only():
    stock = v4_tokenizer_json_path()
    body = {**BODY, "messages": [{"role": "system", "content": "Be brief."}, *BODY["messages"]]}
    ids = Recipe(stock, ["m"], PromptFormat.V4).prepare(CHAT, body, 4096).prompt_ids
    assert ids[0] == 0  # BOS
    with pytest.raises(ApiError, match="could not be encoded"):
        Recipe(stock, ["m"], PromptFormat.V41).prepare(CHAT, body, 4096)


def test_model_types_name_their_template():
    assert PromptFormat.of_model_type("deepseek_v4") is PromptFormat.V4
    assert PromptFormat.of_model_type("deepseek_v41") is PromptFormat.V41
    with pytest.raises(ValueError, match="llama"):
        PromptFormat.of_model_type("llama")


@pytest.mark.parametrize(
    "content",
    [
        " " * 50_000,  # runs of spaces: the vocabulary's longest entries (128 bytes)
        "." * 50_000,
        "-" * 30_000 + "=" * 30_000,
        "字" * 20_000,  # 3 bytes a character
        "🙂" * 10_000,  # 4 bytes a character
        "0123456789" * 5_000,
        "<｜User｜>" * 3_000,  # spellings of special tokens inside user text
        "the quick brown fox " * 3_000,
    ],
    ids=["spaces", "dots", "dashes", "cjk", "emoji", "digits", "specials", "words"],
)
def test_the_length_bound_never_refuses_a_prompt_that_fits(recipe, content):
    """A rendered prompt of n characters has at least ceil(n / max_token_bytes) tokens, for
    the texts that pack the most bytes into a token."""
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    n_tokens = len(recipe.encode(CHAT, body))
    conversation = recipe._convert(CHAT, body).conv.conversation
    rendered = recipe.encoding.render_conversation(conversation)
    chars = _prompt_chars(rendered)
    assert chars == len(rendered.prompt)
    assert n_tokens >= -(-chars // recipe.max_token_bytes)
    # So a context of exactly the prompt's length refuses it for the exact reason, not the bound.
    with pytest.raises(ApiError) as err:
        recipe.prepare(CHAT, json.dumps(body), n_tokens)
    assert "leaves no room for output" in err.value.message
    assert recipe.prepare(CHAT, json.dumps(body), n_tokens + 1).params.max_tokens == 1


def test_the_length_bound_refuses_what_cannot_fit_before_encoding(recipe, monkeypatch):
    monkeypatch.setattr(recipe, "_encode", lambda conv: pytest.fail("encoded anyway"))
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]}
    assert recipe.max_token_bytes == 128
    with pytest.raises(ApiError) as err:
        recipe.prepare(CHAT, json.dumps(body), 1024)  # 1024 x 128 < 200,000 characters
    assert err.value.status == 400
    assert "at least" in err.value.message
