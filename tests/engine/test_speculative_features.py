"""Speculative decoding with the engine's other features: structured output (each verified row
masked by the grammar state after the drafts before it), logprobs (the target's, per emitted
token), penalties (counting the drafts before each row), the prefix cache (blocks published
while drafts were being rejected hold only accepted tokens), and sampling (the same tokens as
plain sampling for the same seed, so the same distribution: chi-square over seeds)."""

from __future__ import annotations

import inspect
import json
import textwrap

import pytest
import torch
from deepring import LLM, SamplingParams
from deepring.structured import build
from test_speculative import ScriptedDrafter, _prompts


@pytest.fixture(scope="module")
def pair(deepring_cache_dir):
    """A plain and a speculating tiny-trained (fixed:5), each made fresh per module."""
    return (
        LLM("tiny-trained", max_model_len=1024, max_num_seqs=8),
        LLM("tiny-trained", max_model_len=1024, max_num_seqs=8, speculative="fixed:5"),
    )


def test_structured_output_is_unchanged(pair):
    plain, spec = pair
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    c = build.json_schema(schema)
    prompts = ["def main():\n", "class Config:\n    name = "]
    params = [
        SamplingParams(temperature=0, max_tokens=60),
        SamplingParams(temperature=0.9, max_tokens=60, seed=4),
    ]
    for p in params:
        want = plain.generate(prompts, p, constraints=c)
        got = spec.generate(prompts, p, constraints=c)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        for o in got:
            if o.finish_reason == "stop":  # the grammar ended it: a document, then EOS
                json.loads(spec.tokenizer.decode(o.token_ids[:-1]))
    assert spec.engine.spec.verified > 0


def test_logprobs_are_the_targets(pair):
    plain, spec = pair
    p = SamplingParams(temperature=0, max_tokens=30, logprobs=3, ignore_eos=True)
    prompts = ["import sys\n\n\ndef run(args):\n", "    for key, value in"]
    want = plain.generate(prompts, p)
    got = spec.generate(prompts, p)
    for a, b in zip(want, got, strict=True):
        assert a.token_ids == b.token_ids
        assert len(b.logprobs) == len(b.token_ids)
        for (la, top_a), (lb, top_b) in zip(a.logprobs, b.logprobs, strict=True):
            assert lb == pytest.approx(la, abs=1e-4)
            assert [t for t, _ in top_a] == [t for t, _ in top_b]


def test_penalties_count_the_drafts_before_each_row(pair):
    plain, spec = pair
    p = SamplingParams(
        temperature=0, max_tokens=40, presence_penalty=0.7, frequency_penalty=0.4, ignore_eos=True
    )
    prompts = ["x = [1, 1, 1, 1, 1", "def f(self):\n        return"]
    want = plain.generate(prompts, p)
    got = spec.generate(prompts, p)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_prefix_cache_blocks_hold_only_accepted_tokens(deepring_cache_dir):
    """A request decodes 300 tokens while its drafts are mostly wrong (published output blocks
    were written by verify steps with rejections); a second request whose prompt is the first
    one's prompt and output hits those blocks, and continues exactly as plain decoding of that
    prompt from scratch does."""
    prompt = _prompts(7, (40,))[0]
    p = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)
    plain = LLM("tiny", max_model_len=1024, max_num_seqs=2)
    first = plain.generate([prompt], p)[0]
    truth = {0: prompt + first.token_ids}
    spec = LLM("tiny", max_model_len=1024, max_num_seqs=2, speculative="mtp")
    spec.engine.spec.drafter = ScriptedDrafter(truth, 1, None, seed=3)
    assert spec.generate([prompt], p)[0].token_ids == first.token_ids
    assert spec.engine.spec.accepted < spec.engine.spec.verified
    follow = prompt + first.token_ids[:280]
    q = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    spec.engine.spec.drafter = ScriptedDrafter({1: follow}, 1, 0)
    got = spec.generate([follow], q)[0]
    assert spec.engine.prefix.stats["hit_tokens"] >= 256, spec.engine.prefix.stats
    fresh = LLM("tiny", max_model_len=1024, max_num_seqs=2)
    assert got.token_ids == fresh.generate([follow], q)[0].token_ids


def test_sampled_speculation_draws_what_plain_sampling_draws(pair):
    """Per seed, speculative sampling emits the tokens plain sampling does (the target's own
    draw at every position decides); over many seeds, the two distributions of the 4th token
    pass a chi-square test (top_k 4, so the support is small)."""
    plain, spec = pair
    prompt = "def __init__(self, name):\n        self.name"
    seeds = range(120)
    ps = [SamplingParams(temperature=1.0, top_k=4, max_tokens=4, seed=s) for s in seeds]
    want = plain.generate([prompt] * len(ps), ps)
    got = spec.generate([prompt] * len(ps), ps)
    same = sum(a.token_ids == b.token_ids for a, b in zip(want, got, strict=True))
    assert same >= len(ps) - 2, same  # rounding of the verify path's logits only
    tokens = sorted({o.token_ids[3] for o in want + got})
    table = [[sum(o.token_ids[3] == t for o in outs) for t in tokens] for outs in (want, got)]
    assert len(tokens) > 1  # the test has something to compare
    assert _chi2_pvalue(table) > 0.01
    assert spec.engine.spec.accepted > 0


def _chi2_pvalue(table: list[list[int]]) -> float:
    """Pearson's chi-square test of independence of a 2 x k contingency table."""
    t = torch.tensor(table, dtype=torch.float64)
    expected = t.sum(1, keepdim=True) * t.sum(0, keepdim=True) / t.sum()
    stat = ((t - expected) ** 2 / expected).sum()
    df = t.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("budget", [0, 3, 7])
def test_thinking_budget_forces_the_end_inside_a_verified_run(pair, temperature, budget):
    """The forced end of thinking lands on the verified row at the budget (drafts that are
    always right put it inside an accepted run), so the output is plain decoding's."""
    plain, spec = pair
    end = 11  # any id can play `</think>`
    p = SamplingParams(
        temperature=temperature, max_tokens=16, seed=5, ignore_eos=True,
        thinking_budget=budget, think_end_id=end,
    )  # fmt: skip
    prompt = _prompts(10, (30,))[0]
    want = plain.generate([prompt], p)[0]
    assert want.token_ids[budget] == end
    saved = spec.engine.spec.drafter
    rid = next(spec._counter)
    truth = {rid + 1: prompt + want.token_ids}
    try:
        spec.engine.spec.drafter = ScriptedDrafter(truth, 5, 5)
        got = spec.generate([prompt], p)[0]
    finally:
        spec.engine.spec.drafter = saved
    assert got.token_ids == want.token_ids


def _recording(llm) -> list[tuple[int, list[int]]]:
    """Every proposal of the engine's drafter from now on, as (tokens up to and including the
    anchor, drafts)."""
    drafter = llm.engine.spec.drafter
    propose, seen = drafter.propose, []

    def recorded(reqs):
        prop = propose(reqs)
        seen.extend((r.num_tokens, d) for r, d in zip(reqs, prop.drafts, strict=True))
        return prop

    drafter.propose = recorded
    return seen


@pytest.mark.parametrize("mode", ["fixed:5", "mtp"])
def test_a_ring_hit_restores_the_drafters_context(deepring_cache_dir, mode):
    """A prompt's ring snapshot at its last block boundary holds the drafter's window too: a
    second prompt sharing those 256 tokens, restored from the snapshot (a ring hit), drafts
    exactly what a cold engine drafts for it (the drafter sees the window before the hit, not
    only the new suffix), and emits the same tokens. (fixed:5 is the DSpark drafter with
    lengths that do not depend on the machine's measured speed, as dspark's do.)"""
    model = "tiny-trained" if mode == "fixed:5" else "tiny"
    warm = LLM(model, max_model_len=1024, max_num_seqs=2, speculative=mode)
    # Python source (what tiny-trained was trained on), so that its drafts follow the context.
    first = warm.encode(inspect.getsource(textwrap))[1:301]
    second = first[:256] + warm.encode(" return")[1:]
    p = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    warm.generate([first], SamplingParams(temperature=0, max_tokens=1))
    seen = _recording(warm)
    got = warm.generate([second], p)[0]
    assert warm.engine.prefix.stats["ring_hits"] == 1, warm.engine.prefix.stats
    cold = LLM(model, max_model_len=1024, max_num_seqs=2, speculative=mode)
    want_seen = _recording(cold)
    want = cold.generate([second], p)[0]
    assert got.token_ids == want.token_ids
    # The two runs step differently (the cold one's prefill stops at the snapshot point, so
    # it drafts one token earlier): compare the drafts at the anchors both proposed at.
    assert_same_drafts_where_both_drafted(seen, want_seen)


def assert_same_drafts_where_both_drafted(seen, want_seen) -> None:
    """Two _recording lists propose the same drafts at every anchor both proposed at (at
    least two of them)."""
    mine, theirs = dict(seen), dict(want_seen)
    common = sorted(set(mine) & set(theirs))
    assert len(common) >= 2, (seen, want_seen)
    assert [mine[a] for a in common] == [theirs[a] for a in common]


def test_ring_snapshots_are_named_by_the_drafter(deepring_cache_dir):
    """An engine drafting with another drafter (or none) never restores a snapshot written
    with this one's rings: its ring keys differ, so its hit replays instead."""
    from deepring.cache.prefix import ring_key

    key = b"k" * 32
    assert len({ring_key(key), ring_key(key, "mtp"), ring_key(key, "dspark")}) == 3
    eng = LLM("tiny", max_model_len=1024, max_num_seqs=2, speculative="mtp").engine
    assert eng.prefix.drafter == "mtp"
    assert LLM("tiny", max_model_len=1024, max_num_seqs=2).engine.prefix.drafter == ""
