"""The engine stepped one step ahead (core.overlap) against the same engine stepped in
sequence: the same tokens, log probabilities and finish reasons for every request (greedy
and sampled, penalties, stop tokens, max_tokens, chunked prompts, arrivals mid-run, the
prefix cache, preemption), aborts that take effect within one step, nothing held once done,
and the next step computing while the caller works."""

from __future__ import annotations

import pytest
from deepring.core.overlap import Overlapped
from deepring.core.zero_cost import ZeroCostRunner
from deepring.sampling.params import SamplingParams
from prefix_helpers import BLOCK, engine, ids
from v4_helpers import model_config, ours

MAX_ITERATIONS = 5_000


@pytest.fixture(scope="module")
def model():
    return ours(model_config("swa-csa-hca"), seed=11)


def _requests(stops: dict[int, int] | None = None):
    """(arrival iteration, rid, prompt, params): a mix of lengths (one beyond the step
    budget: chunked), greedy and sampled rows, penalties, log probabilities."""
    stops = stops or {}
    out = []
    for rid in range(6):
        n = [5, 40, 3 * BLOCK + 1, 9, 130, 17][rid]
        p = SamplingParams(
            max_tokens=[12, 7, 10, 1, 9, 14][rid],
            temperature=[0.0, 0.8, 0.0, 0.0, 0.7, 1.0][rid],
            presence_penalty=0.5 if rid == 4 else 0.0,
            frequency_penalty=0.3 if rid == 5 else 0.0,
            logprobs=2 if rid in (1, 2) else None,
            stop_token_ids=(stops[rid],) if rid in stops else (),
            ignore_eos=True,
            seed=rid,
        )
        out.append(([0, 0, 2, 3, 5, 9][rid], rid, ids(n, 100 + rid), p))
    return out


def _serve(eng, plan, overlapped: bool, abort: tuple[int, int] | None = None):
    """Run `plan` to the end: {rid: (tokens, logprobs, finish reason)}. abort: (rid, k) ends
    request rid once k of its tokens are out (as a worker does when an Abort arrives)."""
    ov = Overlapped(eng) if overlapped else None
    reqs, got = {}, {rid: [] for _, rid, _, _ in plan}
    for it in range(MAX_ITERATIONS):
        for at, rid, prompt, p in plan:
            if at == it:
                reqs[rid] = eng.add(rid, prompt, p, seed=rid)
        if it > max(a for a, *_ in plan) and not (ov.busy if ov else eng.has_work):
            break
        for r in ov.step() if ov else eng.step():
            if r.new_token is not None:
                assert not r.request.finished or r.finished, "a token after the request ended"
                got[r.request.rid].append((r.index, r.new_token, r.logprobs))
        if abort is not None and len(got[abort[0]]) == abort[1] and eng.abort(abort[0]):
            abort_at = it
    else:
        raise AssertionError("the run did not end")
    if abort is not None:
        assert len(got[abort[0]]) == abort[1], "tokens after the abort"
        assert abort_at < it
    out = {}
    for rid, toks in got.items():
        assert [i for i, _, _ in toks] == list(range(len(toks)))
        out[rid] = ([t for _, t, _ in toks], [lp for _, _, lp in toks], reqs[rid].finish_reason)
    # Nothing held: every slot back, no request left, no finished one waiting on a step.
    assert eng.slots.num_free == eng.slots.num_slots
    assert not eng.requests
    assert not eng.scheduler.held
    if eng.prefix is None:
        assert eng.blocks.num_used == 0
    return out


def _logprobs_close(a, b):
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            assert x is y
            continue
        assert x[0] == pytest.approx(y[0], abs=1e-5)
        assert [t for t, _ in x[1]] == [t for t, _ in y[1]]


def _same(seq, ovl):
    assert seq.keys() == ovl.keys()
    for rid in seq:
        assert ovl[rid][0] == seq[rid][0], f"request {rid}'s tokens"
        assert ovl[rid][2] == seq[rid][2], f"request {rid}'s finish reason"
        _logprobs_close(seq[rid][1], ovl[rid][1])


@pytest.mark.parametrize("prefix", [None, "exact"])
@pytest.mark.parametrize("budget", [2048, 64])
def test_overlapped_outputs_equal_sequential(model, prefix, budget):
    """Greedy and sampled outputs, stop tokens included: the overlapped engine emits what the
    sequential one does (a request that stops has one more row computed, never emitted)."""
    free = _serve(engine(model, replay=prefix, budget=budget)[0], _requests(), False)
    # Stop tokens the runs reach mid-output (the token at index 3 of two requests).
    stops = {0: free[0][0][3], 5: free[5][0][3]}
    plan = _requests(stops)
    seq = _serve(engine(model, replay=prefix, budget=budget)[0], plan, False)
    assert seq[0][2] == seq[5][2] == "stop"
    assert len(seq[0][0]) <= 4
    ovl_eng = engine(model, replay=prefix, budget=budget)[0]
    ovl = _serve(ovl_eng, plan, True)
    _same(seq, ovl)
    if prefix is not None:
        # What the overlapped engine cached (blocks, ring snapshots taken while the next step
        # was planned) serves the next turn as a cold run serves it.
        _, rid, prompt, p = plan[4]
        turn = [(0, 50, prompt + ovl[rid][0] + ids(2 * BLOCK + 5, 7), p)]
        cold = _serve(engine(model, budget=budget)[0], turn, False)
        assert _serve(ovl_eng, turn, True) == cold
        assert ovl_eng.prefix.report()["hit_tokens"] >= 8 * BLOCK


def test_preemption_waits_for_the_computing_step(model):
    """A pool too small for every request: the planned step that needs a preemption is
    planned again once the computing one is done; outputs equal the sequential run's."""
    p = SamplingParams(max_tokens=2 * BLOCK, temperature=0.0, ignore_eos=True, seed=1)
    plan = [(0, rid, ids(2 * BLOCK + 3, 200 + rid), p) for rid in range(4)]
    seq_eng = engine(model, num_blocks=14)[0]
    seq = _serve(seq_eng, plan, False)
    ovl_eng = engine(model, num_blocks=14)[0]
    ovl = _serve(ovl_eng, plan, True)
    assert seq_eng.scheduler.num_preemptions > 0
    assert ovl_eng.scheduler.num_preemptions > 0
    _same(seq, ovl)


@pytest.mark.parametrize("k", [1, 4])
def test_an_abort_takes_effect_within_one_step(model, k):
    """A request aborted while a step holding it computes gets no token after the abort; its
    slot and blocks are freed once that step is done; the others are unaffected."""
    plan = _requests()
    seq = _serve(engine(model)[0], plan, False)
    eng = engine(model)[0]
    ovl = _serve(eng, plan, True, abort=(2, k))
    assert ovl[2][2] == "abort"
    assert ovl[2][0] == seq[2][0][:k]
    _same({r: v for r, v in seq.items() if r != 2}, {r: v for r, v in ovl.items() if r != 2})


def test_the_next_step_computes_while_this_one_is_posted():
    """The paced zero-cost runner: each step() launches the next step before it posts the one
    that completed, and returns with it computing."""
    from deepring.cache.pool import CacheConfig
    from deepring.core.engine import EngineCore
    from deepring.core.scheduler import SchedulerConfig

    eng = EngineCore(
        ZeroCostRunner(list(range(100, 200)), step_seconds=0.002),
        CacheConfig(num_blocks=64, num_slots=4, block_size=16),
        SchedulerConfig(max_num_seqs=4),
        max_model_len=512,
        vocab_size=1000,
    )
    reqs = [eng.add(i, [1, 2, 3], SamplingParams(max_tokens=6, seed=i), seed=i) for i in range(3)]
    ov = Overlapped(eng)
    calls = 0
    while ov.busy and calls < 100:
        calls += 1
        results = ov.step()
        names = [n for n, *_ in ov.spans]
        if results and any(r.ahead for r in reqs):
            # ... plan the next step, wait for this one, launch the next, post this one.
            w = names.index("wait")
            assert names[w - 1] == "schedule"
            assert names[w + 1 :] == ["compute", "launch", "post"]
            assert ov.spans[-2][2] <= ov.spans[-1][1]
            assert ov.inflight is not None
    # One call per step (the first launches its step too), and no step past max_tokens (it is
    # known in advance: the last step's requests are not planned again).
    assert [len(r.output_ids) for r in reqs] == [6, 6, 6]
    assert eng.num_steps == 6
    assert calls == 6
    expect = [[eng.runner.token_at(r.seed, 3 + i) for i in range(6)] for r in reqs]
    assert [r.output_ids for r in reqs] == expect


def test_constrained_and_thinking_rows_equal_sequential(deepring_cache_dir, monkeypatch):
    """Offline, the tiny model: constrained rows (their next mask needs this step's token)
    and a thinking budget (whether the next token is forced) beside plain rows, greedy and
    sampled: LLM(overlap=True) generates what the sequential engine does, and every step is
    launched with such rows' matchers and thinking state caught up with their output (a
    race the outputs alone would only show when it is lost)."""
    from deepring import LLM
    from deepring.core.runner import ModelRunner
    from deepring.structured import build
    from deepring.structured.runtime import GrammarState

    advanced: dict[int, int] = {}
    advance = GrammarState.advance

    def counted(self, token):
        advanced[id(self)] = advanced.get(id(self), 0) + 1
        return advance(self, token)

    launch = ModelRunner.launch
    checked = []

    def caught_up(self, scheduled, prepared=None):
        for s in scheduled:
            r = s.request
            if r.grammar is not None:
                assert advanced.get(id(r.grammar), 0) == len(r.output_ids)
                checked.append(r.rid)
            if r.params.thinking_budget is not None:
                assert r.thinking_ended == (r.params.think_end_id in r.output_ids)
        return launch(self, scheduled, prepared)

    monkeypatch.setattr(GrammarState, "advance", counted)
    monkeypatch.setattr(ModelRunner, "launch", caught_up)

    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
              "maxItems": 6}  # fmt: skip
    prompts = ["Write JSON.", "Count to ten.", "Write JSON.", "Think first.", "Hi"]
    params = [
        SamplingParams(temperature=0, max_tokens=48),
        SamplingParams(temperature=0.8, max_tokens=20, seed=3),
        SamplingParams(temperature=1.0, max_tokens=48, seed=7),
        SamplingParams(temperature=0, max_tokens=24, thinking_budget=5, think_end_id=128822),
        SamplingParams(temperature=0.7, max_tokens=16, seed=9, presence_penalty=0.4),
    ]
    constraints = [build.json_schema(schema), None, build.json_schema(schema), None, None]
    outs = {}
    for overlap in (False, True):
        llm = LLM("tiny", max_num_seqs=8, max_model_len=1024, overlap=overlap)
        got = llm.generate(prompts, params, constraints=constraints)
        outs[overlap] = [(o.token_ids, o.finish_reason) for o in got]
        assert not llm.engine.requests
        assert not llm.engine.scheduler.held
    assert outs[True] == outs[False]
    assert checked  # (the constrained rows went through launch)
    assert outs[False][0][1] == "stop"  # the grammar ended it
    assert 128822 in outs[False][3][0][:6]  # the budget forced the end of thinking


def test_v41_overlapped_equals_sequential(deepring_cache_dir):
    """V4.1 (`v41-tiny`: Engram reads the tokens before each chunk, the decoder its last KEEP
    prompt tokens) through LLM(overlap=True): the batch built before the last token is known
    gets it at launch, and the outputs are the sequential engine's, chunked prompts included."""
    from deepring import LLM

    prompts = [ids(n, 300 + n) for n in (7, 60, 200, 3)]
    params = [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.9, max_tokens=9, seed=2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0.6, max_tokens=14, seed=4, ignore_eos=True, logprobs=1),
    ]
    outs = {}
    for overlap in (False, True):
        llm = LLM("v41-tiny", max_model_len=512, max_num_seqs=4, num_blocks=64,
                  max_num_batched_tokens=96, overlap=overlap)  # fmt: skip
        outs[overlap] = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]
    assert outs[True] == outs[False]
