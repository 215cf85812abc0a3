"""SamplingParams.thinking_budget: once the output holds that many tokens without the end of
thinking, the end of thinking is the next token, greedy and sampled, with and without a
grammar; the tokens before it are those of a run without a budget (the reference)."""

from __future__ import annotations

import dataclasses

import pytest
from deepring.llm import LLM
from deepring.sampling.params import SamplingParams
from deepring.structured import build
from deepring.structured.grammar import Markers
from prefix_helpers import engine, ids, run
from v4_helpers import model_config, ours

END = 11  # the test model has no tokenizer: any id can play `</think>`
THINK_END, DSML = 128822, 128825  # the tiny model's (V4 tokenizer)


@pytest.fixture(scope="module")
def model():
    return ours(model_config("swa-csa-hca"), seed=3)


def _params(temperature: float, **kw) -> SamplingParams:
    base = {"max_tokens": 10, "temperature": temperature, "ignore_eos": True, "seed": 9}
    return SamplingParams(**{**base, **kw})


@pytest.mark.parametrize("logprobs", [None, 0])  # None and greedy: the argmax-only head
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("budget", [0, 3, 6])
def test_the_end_of_thinking_comes_at_the_budget(model, temperature, budget, logprobs):
    prompt = ids(21, 4)
    eng, rec = engine(model)
    free, _, _ = run(eng, rec, None, prompt, _params(temperature))
    assert END not in free[: budget + 1]  # (else the budget would not be reached)
    p = _params(temperature, thinking_budget=budget, think_end_id=END, logprobs=logprobs)
    req = eng.add(1 << 30, prompt, p, 5)
    lps = []
    for _ in range(100):
        if not eng.has_work:
            break
        lps += [r.logprobs for r in eng.step() if r.request is req and r.new_token is not None]
    assert req.output_ids[:budget] == free[:budget]
    assert req.output_ids[budget] == END
    assert req.thinking_ended
    if logprobs is not None:
        assert lps[budget][0] == 0.0  # the only token the sampler was given


def test_a_budget_never_reached_changes_nothing(model):
    prompt = ids(17, 5)
    eng, rec = engine(model)
    free, _, _ = run(eng, rec, None, prompt, _params(0.0))
    got, _, _ = run(eng, rec, None, prompt, _params(0.0, thinking_budget=10, think_end_id=END))
    assert got == free


def test_a_resumed_request_that_already_ended_thinking_is_not_forced(model):
    prompt = ids(19, 6)
    eng, rec = engine(model)
    done = [3, END, 4]
    free, _, _ = run(eng, rec, None, prompt + done, _params(0.0, max_tokens=7))
    p = _params(0.0, thinking_budget=1, think_end_id=END)
    req = eng.add(7, prompt, p, 5, output_ids=done)
    assert req.thinking_ended
    for _ in range(100):
        if not eng.has_work:
            break
        eng.step()
    assert req.output_ids[3:] == free  # as if there were no budget


def test_bad_budgets_are_refused(model):
    with pytest.raises(ValueError, match="think_end_id"):
        SamplingParams(thinking_budget=4)
    with pytest.raises(ValueError, match="thinking_budget"):
        SamplingParams(thinking_budget=-1, think_end_id=2)
    eng, _ = engine(model)
    p = dataclasses.replace(_params(0.0), thinking_budget=2, think_end_id=10**9)
    with pytest.raises(ValueError, match="out of range"):
        eng.add(8, ids(9, 1), p, 5)
    wire = _params(0.0, thinking_budget=2, think_end_id=END).to_wire()
    assert SamplingParams.from_wire(wire).thinking_budget == 2
    with pytest.raises(ValueError, match="thinking_budget"):
        SamplingParams.from_wire({**wire, "thinking_budget": "2"})


def test_with_a_grammar_the_answer_still_follows_and_validates(deepring_cache_dir):
    llm = LLM("tiny", max_num_seqs=4, max_model_len=512)
    c = build.json_schema({"enum": [17, 42]}, reasoning=True, markers=Markers(THINK_END, DSML))
    budget = 4
    params = [
        SamplingParams(temperature=t, max_tokens=64, seed=3, thinking_budget=budget,
                       think_end_id=THINK_END)
        for t in (0.0, 1.0)
    ]  # fmt: skip
    for out in llm.generate(["Think briefly."] * 2, params, constraints=c):
        at = out.token_ids.index(THINK_END)
        # At the budget, or a token or two later when it fell inside a character.
        assert budget <= at <= budget + 3, out.token_ids
        assert out.finish_reason == "stop"
        assert llm.tokenizer.decode(out.token_ids[at + 1 : -1]) in ("17", "42")


def test_the_zero_cost_runner_ends_the_reasoning_too():
    from deepring.cache.pool import CacheConfig
    from deepring.core.engine import EngineCore
    from deepring.core.scheduler import SchedulerConfig
    from deepring.core.zero_cost import ZeroCostRunner

    runner = ZeroCostRunner(list(range(100, 150)))
    cache = CacheConfig(num_blocks=16, num_slots=2, block_size=16)
    eng = EngineCore(runner, cache, SchedulerConfig(max_num_seqs=2), max_model_len=256,
                     vocab_size=1000)  # fmt: skip
    p = _params(0.0, thinking_budget=2, think_end_id=END)
    req = eng.add(1, ids(5, 1), p, 5)
    while eng.has_work:
        eng.step()
    canned = [runner.token_at(5, len(req.prompt_ids) + i) for i in range(10)]
    assert req.output_ids == [*canned[:2], END, *canned[3:]]
