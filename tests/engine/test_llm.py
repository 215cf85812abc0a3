"""The offline API over the embedded tiny model: prompts in every form, continuous batching,
preemption, stop conditions, the cached tiny checkpoint and its tokenizer."""

from __future__ import annotations

import json
import sys

import deepring_recipe
import pytest
from deepring import LLM, SamplingParams
from deepring.model.config import CSA, HASH_MOE, HCA, MOE, SLIDING
from deepring.model.tiny import tiny_model_dir
from deepring.protocol.tokenizer import build_v41_tokenizer_json


@pytest.fixture(scope="module")
def cache_dir(deepring_cache_dir):
    return deepring_cache_dir


@pytest.fixture(scope="module")
def llm(cache_dir):
    return LLM("tiny", max_num_seqs=4, max_num_batched_tokens=96, max_model_len=512)


def test_tiny_model_has_every_part(llm, cache_dir):
    c = llm.config
    assert {SLIDING, CSA, HCA} <= set(c.layer_types)
    assert {HASH_MOE, MOE} <= set(c.mlp_layer_types)
    assert c.num_nextn_predict_layers == 1
    assert len(llm.model.mtp) == 1
    path = tiny_model_dir()
    assert path.parent == cache_dir
    assert (path / "model.safetensors").is_file()
    assert json.loads((path / "config.json").read_text())["model_type"] == "deepseek_v4"
    assert (path / "tokenizer.json").read_text(encoding="utf-8") == build_v41_tokenizer_json()
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_dir() == path  # cached: not rewritten
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime


def test_v41_tokenizer_matches_test_fixture(v41_tokenizer_path):
    sys.path.insert(0, str(v41_tokenizer_path.parent))
    assert build_v41_tokenizer_json() == v41_tokenizer_path.read_text(encoding="utf-8")
    tok = deepring_recipe.Tokenizer.from_file(str(v41_tokenizer_path))
    assert tok.token_to_id("<｜System｜>") == 129280


def test_text_prompt_is_bos_plus_encoding(llm):
    greedy = SamplingParams(temperature=0, max_tokens=6)
    text = "Hello there, tiny model."
    ids = [0, *llm.tokenizer.encode(text)]
    a = llm.generate(text, greedy)[0]
    b = llm.generate(ids, greedy)[0]
    assert a.prompt_token_ids == ids
    assert a.token_ids == b.token_ids
    assert len(a.token_ids) == 6
    assert a.finish_reason == "length"
    assert a.text == llm.tokenizer.decode(a.token_ids)


def _prompts(n: int) -> list[list[int]]:
    return [[(37 * i + 11 * j) % 129000 + 3 for j in range(5 + 23 * i)] for i in range(n)]


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=6),
        SamplingParams(temperature=0.9, top_p=0.95, seed=5, max_tokens=9),
        SamplingParams(temperature=1.2, top_k=20, seed=6, max_tokens=5),
    ]


def test_continuous_batching_equals_each_alone(llm):
    # More prompts than batch slots (4), and prompts longer than the step budget (96 tokens).
    prompts = _prompts(6)
    params = [_params()[i % 3] for i in range(6)]
    together = llm.generate(prompts, params)
    for p, sp, out in zip(prompts, params, together, strict=True):
        assert llm.generate(p, sp)[0].token_ids == out.token_ids
    assert [len(o.token_ids) for o in together] == [sp.max_tokens for sp in params]


def test_preemption_recomputes_to_the_same_tokens(cache_dir):
    # Three requests that cross the 128-token block boundary while decoding, in a pool with
    # room for three blocks: growing one forces another out, to be recomputed later.
    prompts = [
        [(7 * i + 3 * j) % 1000 + 3 for j in range(n)] for i, n in enumerate((122, 120, 125))
    ]
    params = _params()
    # The reference differs only in its pool size: the same step budget chunks the prompts the
    # same way (chunked and whole prefills agree to rounding, which sampling can amplify).
    roomy = LLM("tiny", max_num_seqs=3, max_model_len=256)
    want = [o.token_ids for o in roomy.generate(prompts, params)]
    assert roomy.engine.scheduler.num_preemptions == 0
    small = LLM("tiny", max_num_seqs=3, max_model_len=256, num_blocks=4)
    got = [o.token_ids for o in small.generate(prompts, params)]
    assert small.engine.scheduler.num_preemptions > 0
    assert got == want


def test_stop_token_ids_and_eos(llm):
    p = _prompts(3)[2]
    base = llm.generate(p, SamplingParams(temperature=0, max_tokens=12))[0].token_ids
    stop = base[4]
    out = llm.generate(p, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop,)))[0]
    assert out.token_ids == base[: base.index(stop) + 1]
    assert out.finish_reason == "stop"
    eos = llm.engine.eos_token_ids
    try:
        llm.engine.eos_token_ids = frozenset({base[2]})
        out = llm.generate(p, SamplingParams(temperature=0, max_tokens=12))[0]
        assert out.token_ids == base[: base.index(base[2]) + 1]
        assert out.finish_reason == "stop"
        out = llm.generate(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
        assert out.token_ids == base
        assert out.finish_reason == "length"
    finally:
        llm.engine.eos_token_ids = eos


@pytest.mark.parametrize(
    ("prompt", "match"),
    [([], "at least one token"), ([129281], "out of range"), ([5] * 600, "max_model_len")],
)
def test_bad_prompts_are_rejected(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([[5, 6, 7], prompt], SamplingParams(max_tokens=4))
    assert not llm.engine.has_work  # the good prompt before it was withdrawn too


CHAT = {
    "model": "tiny",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
    ],
}


def _official_ids(body: dict, fmt: str, tokenizer_path) -> list[int]:
    """The official library's rendering of `body` with the V4 or V4.1 template, each special
    range and plain segment encoded by Hugging Face tokenizers (the independent reference)."""
    official = pytest.importorskip("deepseek_recipe")
    from tokenizers import Tokenizer as HFTokenizer

    v4 = fmt == "deepseek_v4"
    version = official.ModelVersion.DeepseekV4Pro if v4 else official.ModelVersion.DeepseekV41Flash
    options = official.ConversionOptions().with_model_alias(body["model"], version)
    conv = official.ChatCompletionRequest(body).convert(options)
    encoding = official.DeepseekV4Encoding() if v4 else official.DeepseekV41Encoding()
    rendered = encoding.render_conversation(conv.conversation)
    hf = HFTokenizer.from_file(str(tokenizer_path))
    want, pos = [], 0
    for a, b in [*rendered.special_ranges, (len(rendered.prompt), len(rendered.prompt))]:
        if a > pos:
            want += hf.encode(rendered.prompt[pos:a], add_special_tokens=False).ids
        if b > a:
            want.append(hf.token_to_id(rendered.prompt[a:b]))
        pos = b
    assert "What is 2+2?" in rendered.prompt
    return want


@pytest.mark.parametrize("fmt", ["deepseek_v4", "deepseek_v41"])
def test_protocol_layer_encodes_as_the_official_recipe_renders(v41_tokenizer_path, fmt):
    from deepring.protocol.formats import PromptFormat
    from deepring.protocol.prepare import CHAT as CHAT_API
    from deepring.protocol.prepare import Recipe

    recipe = Recipe(v41_tokenizer_path, ["tiny"], PromptFormat(fmt))
    assert recipe.encode(CHAT_API, CHAT) == _official_ids(CHAT, fmt, v41_tokenizer_path)


def test_chat_body_renders_with_the_model_family_template(llm):
    # tiny is a deepseek_v4 checkpoint: its chat prompts use the V4 template.
    out = llm.generate(CHAT, SamplingParams(temperature=0, max_tokens=3))[0]
    tok = tiny_model_dir() / "tokenizer.json"
    assert out.prompt_token_ids == _official_ids(CHAT, "deepseek_v4", tok)


def test_chat_body_must_name_the_model_and_bad_bodies_are_rejected(llm):
    out = llm.generate(CHAT, SamplingParams(temperature=0, max_tokens=2))[0]
    assert out.finish_reason == "length"
    for name in ("gpt-4", "DeepSeek-V4.1-Flash", "DeepSeek-V4-Pro"):
        with pytest.raises(ValueError, match=r"chat request rejected.*tiny"):
            llm.generate({**CHAT, "model": name}, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="invalid request body"):
        llm.generate({"model": "tiny", "messages": "nope"}, SamplingParams(max_tokens=2))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"temperature": 0.3}, "temperature: offline generation takes sampling"),
        ({"max_tokens": 5}, "max_tokens: offline generation"),
        ({"top_k": 5}, "top_k: offline generation"),
        ({"stream": True}, "stream: offline generation"),
        ({"n": 2}, "only n = 1"),  # the recipe's own check
        ({"frobnicate": 1}, "frobnicate"),  # unknown fields: as the server refuses them
        ({"store": True}, "store"),  # served fields: as the server checks them
    ],
)
def test_chat_body_fields_are_checked_and_sampling_comes_from_params(llm, extra, match):
    with pytest.raises(ValueError, match=match):
        llm.generate({**CHAT, **extra}, SamplingParams(temperature=0, max_tokens=2))
    # Null sampling fields and stream false say nothing: accepted.
    quiet = {**CHAT, "temperature": None, "stream": False}
    assert len(llm.generate(quiet, SamplingParams(temperature=0, max_tokens=2))[0].token_ids) == 2


def test_chat_body_thinking_budget_is_enforced(llm):
    body = {**CHAT, "thinking": {"type": "enabled", "budget_tokens": 2}}
    think_end = llm.tokenizer.token_to_id("</think>")
    p = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate(body, p)[0]
    assert out.token_ids[2] == think_end or think_end in out.token_ids[:2]
