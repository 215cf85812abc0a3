"""The cost router (routing/balance.py) and the registry's load estimates, against brute force
on small cases."""

from __future__ import annotations

import itertools
import random

import pytest
from deepring.cost.model import StepCost
from deepring.cost.presets import H800_GPU
from deepring.ipc.messages import Health, Stats
from deepring.routing.balance import TIE_FRACTION, TIE_S, CostRouter
from deepring.routing.registry import WorkerRegistry
from deepring.routing.router import Reported, WorkerLoad


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _stats(wid: str, model: StepCost, **kw) -> Stats:
    base = dict(
        waiting=0, running=0, free_slots=64, num_slots=64, used_blocks=0, num_blocks=4000,
        queued_tokens=0, steps=10, step_seconds=0.1, compute_seconds=0.05,
        busy_seconds=0.2, generated=0, preemptions=0, prefix_cache={},
        dropped={}, step_cost=model.to_wire(), backlog_s=0.0, lag_s=0.0, context_tokens=0,
    )  # fmt: skip
    return Stats(worker=wid, gen=1, **{**base, **kw})


def _registry(prefill: list[StepCost], decode: list[StepCost], router: str = "cost", **kw):
    clock = _Clock()
    reg = WorkerRegistry(len(prefill), len(decode), router=router, clock=clock, **kw)
    pid = itertools.count(1)
    for role, models in (("prefill", prefill), ("decode", decode)):
        for i, model in enumerate(models):
            wid = f"{role}-{i}"
            info = {"role": role, "num_slots": 64, "num_blocks": 4000, "block_size": 128,
                    "max_num_batched_tokens": 4096}  # fmt: skip
            w = reg.add(wid, Health(worker=wid, gen=1, state="ready", pid=next(pid), info=info))
            reg.report(w, _stats(wid, model))
    return reg, clock


def _makespan(jobs: list[tuple[int, int]], models: list[StepCost], owner: list[int]) -> float:
    busy = [0.0] * len(models)
    for (n, start), w in zip(jobs, owner, strict=True):
        busy[w] += models[w].prompt_seconds(n, start, 4096)
    return max(busy)


def test_prefill_makespan_against_brute_force():
    """Bursts of prompts (longest first) on prefill workers of different speeds: sending each
    to the worker that finishes it first stays within LPT's bound for related machines (19/12
    of the best assignment, found by trying them all), and does better on average than
    counting tokens, which ignores the speeds and the attention's growth with context."""
    ratios: dict[str, list[float]] = {"cost": [], "tokens": []}
    for seed in range(8):
        rng = random.Random(seed)
        models = [H800_GPU.scaled(rng.choice((1.0, 1.0, 1.5, 2.5))) for _ in range(3)]
        jobs = [(rng.choice((200, 800, 3000, 12000, 30000)), rng.choice((0, 0, 8000)))
                for _ in range(7)]  # fmt: skip
        jobs.sort(key=lambda j: -j[0])
        best = min(
            _makespan(jobs, models, list(o)) for o in itertools.product(range(3), repeat=len(jobs))
        )
        for router in ratios:
            reg, _ = _registry(models, [H800_GPU], router=router)
            owner = []
            for rid, (n, start) in enumerate(jobs):
                p, d = reg.route(n + start, uncached=n)
                reg.assign(rid, n + start, p, d, uncached=n)
                owner.append(int(p.id.split("-")[1]))
            ratios[router].append(_makespan(jobs, models, owner) / best)
    assert max(ratios["cost"]) <= 19 / 12
    assert sum(ratios["cost"]) < sum(ratios["tokens"])


def test_each_prefill_pick_finishes_first():
    rng = random.Random(7)
    router = CostRouter()
    for _ in range(200):
        loads = [
            WorkerLoad(f"prefill-{i}", cost=H800_GPU.scaled(rng.uniform(0.5, 3)),
                       backlog_s=rng.uniform(0, 5), chunk=rng.choice((512, 4096)))
            for i in range(4)
        ]  # fmt: skip
        n, start = rng.randint(1, 20000), rng.choice((0, 1000, 20000))
        for w in loads:
            w.requests = rng.randint(0, 3)
        done = [w.backlog_s + w.cost.prompt_seconds(n, start, w.chunk) for w in loads]
        pick = router.pick_prefill(loads, n, n + start)
        # The earliest, or one as early within what the models can tell apart that holds
        # fewer requests.
        tie = min(done) + max(TIE_S, TIE_FRACTION * min(done))
        near = [w for w, d in zip(loads, done, strict=True) if d <= tie]
        assert pick in near
        assert pick.requests == min(w.requests for w in near)


def test_predictions_too_close_to_tell_apart_do_not_starve_a_worker():
    """The zero-cost mode's fits: microseconds per step, one worker's a little slower. Every
    worker still gets requests (the one with fewer takes the next), prefill and decode."""
    fast = StepCost.of(2e-5, 1e-7, 1e-6, 0.0, 0.0)
    slow = fast.scaled(1.7)
    router = CostRouter(block_size=16)
    prefill = [WorkerLoad("prefill-0", cost=fast), WorkerLoad("prefill-1", cost=slow)]
    decode = [
        WorkerLoad(f"decode-{i}", cost=m, num_slots=64, num_blocks=4000)
        for i, m in enumerate((fast, slow))
    ]
    for _ in range(20):
        p = router.pick_prefill(prefill, 200, 200)
        p.requests += 1
        p.backlog_s += p.cost.prompt_seconds(200, 0, 4096)
        d = router.pick_decode(decode, 200)
        d.requests += 1
        d.used_tokens += 201
    assert [w.requests for w in prefill] == [10, 10]
    assert [w.requests for w in decode] == [10, 10]


def _relative_max(loads: list[WorkerLoad], router: CostRouter, prompt: int, at: int) -> float:
    """The cluster's largest load relative to the mean (KV blocks or step time) with the
    request placed on worker `at`; the means are those once the request is placed, on average
    (1/n of it on each worker), which do not depend on where it goes."""
    n = len(loads)
    before = [router._decode_load(w, 0, 0) for w in loads]
    after = [router._decode_load(w, 1, prompt + 1) for w in loads]
    growth = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)]
    kv_mean = (sum(b[0] for b in before) + sum(g[0] for g in growth) / n) / n
    step_mean = (sum(b[1] for b in before) + sum(g[1] for g in growth) / n) / n
    placed = [after[i] if i == at else before[i] for i in range(n)]
    return max(max(kv / kv_mean, step / step_mean) for kv, step in placed)


@pytest.mark.parametrize("seed", range(4))
def test_each_decode_pick_against_brute_force(seed):
    """Placing the request where its worker's relative load ends lowest is the placement,
    among all, that leaves the cluster's largest relative load lowest."""
    rng = random.Random(seed)
    router = CostRouter(block_size=128)
    for _ in range(100):
        loads = []
        for i in range(5):
            requests = rng.randint(0, 40)
            tokens = sum(rng.choice((300, 1500, 20000)) for _ in range(requests))
            w = WorkerLoad(
                f"decode-{i}",
                requests=requests,
                used_tokens=tokens,
                num_slots=64,
                num_blocks=20000,
                cost=H800_GPU.scaled(rng.choice((1.0, 1.0, 1.6))),
            )
            loads.append(w)  # fmt: skip
        prompt = rng.choice((100, 2000, 30000))
        pick = loads.index(router.pick_decode(loads, prompt))
        best = min(_relative_max(loads, router, prompt, i) for i in range(len(loads)))
        assert _relative_max(loads, router, prompt, pick) == pytest.approx(best)


def test_decode_prefers_a_worker_with_room_and_one_under_the_target():
    router = CostRouter(block_size=128, tbt_target_s=0.03)
    full = WorkerLoad("decode-0", requests=8, num_slots=8, num_blocks=1000, cost=H800_GPU)
    slow = WorkerLoad("decode-1", requests=1, num_slots=8, num_blocks=1000, cost=H800_GPU.scaled(2))
    busy = WorkerLoad("decode-2", requests=7, used_tokens=7 * 900, num_slots=8, num_blocks=1000,
                      cost=H800_GPU)  # fmt: skip
    assert router.pick_decode([full, slow, busy], 100).worker == "decode-2"  # slow: 40ms+ steps
    assert router.pick_decode([full], 100).worker == "decode-0"  # nobody has room: still one
    assert router.pick_decode([], 100) is None


def test_a_report_counts_what_the_worker_had_taken_in():
    """Prefill backlog: the report's, less the time since, plus what it could not count (sent
    after the worker last read its messages, Stats.lag_s)."""
    reg, clock = _registry([H800_GPU], [H800_GPU])
    p, d = reg.workers["prefill-0"], reg.workers["decode-0"]
    cost = H800_GPU.prompt_seconds(4000, 0, 4096)
    reg.assign(1, 4000, p, d)  # at t=100
    assert reg.backlog_s(p, clock.now) == pytest.approx(cost)  # its report predates it
    clock.now = 100.5
    reg.assign(2, 4000, p, d)  # at t=100.5
    clock.now = 101.0
    # The report (sent at 101 after a 0.8 s step) saw request 1 but not request 2.
    reg.report(p, _stats("prefill-0", H800_GPU, backlog_s=cost - 0.3, lag_s=0.8))
    clock.now = 101.2
    assert reg.backlog_s(p, clock.now) == pytest.approx(cost - 0.3 - 0.2 + cost)
    reg.prefilled(1, 4000, p)
    reg.prefilled(2, 4000, p)
    clock.now = 110.0
    assert reg.backlog_s(p, clock.now) == 0.0


def test_decode_load_is_the_larger_of_the_reports_and_the_books():
    reg, _ = _registry([H800_GPU], [H800_GPU, H800_GPU])
    p, d0, d1 = (reg.workers[w] for w in ("prefill-0", "decode-0", "decode-1"))
    reg.assign(1, 1000, p, d0)  # still in prefill: no report can hold it
    assert d0.load.estimates(128)[:2] == (1, 1000)
    # Another frontend's 30 requests on decode-1: only its report knows them.
    reg.report(d1, _stats("decode-1", H800_GPU, running=30, free_slots=34, used_blocks=400,
                          context_tokens=40000))  # fmt: skip
    assert d1.load.reported == Reported(30, 40000, 400)
    assert d1.load.estimates(128)[0] == 30
    assert d1.load.estimates(128)[2] == 400
    _, d = reg.route(500)
    assert d.id == "decode-0"
    reg.prefilled(1, 1000, p)  # handed off: decode-0's reports hold it from now on
    assert d0.load.in_prefill == d0.load.in_prefill_tokens == 0
    assert d0.load.estimates(128)[0] == 1  # the frontend's books still do
    reg.release(1, 1000, 3, "prefill-0", "decode-0")
    assert d0.load.estimates(128)[0] == 0


def test_a_worker_not_measured_yet_is_assumed_to_run_like_its_peers():
    """A report before a worker's first measured steps carries its prior: the registry drops
    it and the router predicts the worker with its measured peers' mean model, so a prior far
    slower than the real steps (the zero-cost mode's microseconds) does not starve it."""
    fast = StepCost.of(2e-5, 1e-7, 1e-6, 0.0, 0.0)
    reg, _ = _registry([fast, fast], [fast, fast])
    for wid, steps in (("prefill-1", 0), ("decode-1", 2)):
        w = reg.workers[wid]
        reg.report(w, _stats(wid, H800_GPU, steps=steps))
        assert w.load.cost is None
    router = CostRouter(block_size=128)
    loads = [w.load for w in reg.workers.values() if w.role == "decode"]
    assert router.model(loads[1], router.peers(loads)).coef == pytest.approx(fast.coef)
    picks = [router.pick_decode(loads, 100).worker for _ in range(2)]
    assert sorted(picks) == ["decode-0", "decode-1"]  # a tie: rotation, not starvation
    prefill = [w.load for w in reg.workers.values() if w.role == "prefill"]
    assert router.pick_prefill(prefill, 100) is not None
    assert {router.pick_prefill(prefill, 100).worker for _ in range(4)} == {
        "prefill-0",
        "prefill-1",
    }
