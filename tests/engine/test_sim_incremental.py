"""The simulator's carried-over bookkeeping (ClusterConfig.incremental: sim.batch, the frontend's
message streams, block chains continued turn to turn) against reading and hashing everything
again at every step: the same simulation, float for float, under the paths that change a
batch (admissions, finishes, preemptions, a worker short of blocks, noise, the pacer)."""

from __future__ import annotations

import collections
from dataclasses import replace

import numpy as np
import pytest
from deepring.cost.presets import H800_GPU
from deepring.routing.prefix_estimate import PrefixEstimate
from deepring.sim import batch, fastforward
from deepring.sim.cluster import Cluster, ClusterConfig
from deepring.sim.report import summarize
from deepring.sim.runner import PERIOD, SharedBlocks, SimRunner
from deepring.sim.trace import SHAPES, generate


def test_chains_continue_as_prefix_estimate_hashes_them():
    rng = np.random.default_rng(0)
    shared = SharedBlocks(16)
    for n in (0, 1, 15, 16, 17, 160, 333):
        tokens = rng.integers(0, 100_000, n, dtype=np.int32)
        full = PrefixEstimate(16).chain(np.append(tokens, 0))  # SharedBlocks.write's keys
        for cut in sorted({0, n // 3, n // 2, n}):
            head = shared.extend([], tokens[:cut], cut // 16)
            assert shared.extend(head, tokens, n // 16) == full
        assert shared.extend(full, tokens, (n - 1) // 16 if n else 0) == shared.chain(tokens)


def test_the_token_cycle_is_token_at():
    tokens, array = batch.cycle(5)
    assert len(tokens) >= 2 * PERIOD + 5
    assert tokens == array.tolist() == [SimRunner.token_at(x, 0) for x in range(len(tokens))]
    for seed, position in ((0, 0), (7, 12345), (98765, 3)):
        x = (seed + position) % PERIOD
        assert SimRunner.token_at(seed, position) == tokens[x] == tokens[x + PERIOD]


def _books(c: Cluster):
    """Everything a run leaves behind, for comparing two."""
    states = sorted([*c.finished, *c.requests.values()], key=lambda s: s.rid)
    reqs = [
        (s.rid, s.session.sid, s.turn, s.arrival, s.first_at, s.last_at, s.done_at, s.received,
         s.prefill, s.decode, s.uncached, s.error, s.output)
        for s in states
    ]  # fmt: skip
    gaps = collections.Counter()
    for value, count in zip(*c.tbt_gaps(), strict=True):
        gaps[float(value)] += int(count)
    workers = {}
    for wid, w in c.workers.items():
        e = w.engine
        workers[wid] = (
            e.num_steps, e.num_generated, e.step_seconds, e.compute_seconds, e.last_step,
            e.cost.solve(), e.blocks.num_used, e.scheduler.num_preemptions, w.clock.now,
            w.busy_s, w.steps,
        )  # fmt: skip
    return reqs, gaps, c.samples, workers, sorted(c.shared.keys)


@pytest.mark.parametrize("router", ["cost", "tokens"])
def test_carried_books_change_nothing(router, monkeypatch):
    """Decode workers short of blocks (preemptions, runs cut by the blocks), handoffs and
    messages in flight, noisy steps and the pacer: the run with everything carried over is
    the run that reads everything again, down to every token, gap, fit and step."""
    short = []  # plans on a decode worker with fewer free blocks than running requests

    def plan(role, runner, until, min_steps=2):
        e = role.engine
        short.append(0 < len(e.scheduler.running) > e.blocks.num_free)
        return planned(role, runner, until, min_steps)

    planned = fastforward.plan
    monkeypatch.setattr(fastforward, "plan", plan)
    trace = generate(replace(SHAPES["h800"], sessions=200, rate=10.0, think_mean_s=1.0,
                             output_median=600), seed=11)  # fmt: skip
    config = ClusterConfig(
        prefill=2, decode=4, model=H800_GPU, router=router, max_num_seqs=48,
        prefill_budget=4096, max_model_len=65536, num_blocks=600, noise=0.05,
        tbt_target_s=0.05, latency_s=0.002, handoff_s=0.004,
        truth={"decode-1": H800_GPU.scaled(1.5), "prefill-0": H800_GPU.scaled(1.3)},
    )  # fmt: skip
    fast = Cluster(config, trace).run()
    assert sum(short) > 100
    slow = Cluster(replace(config, incremental=False), trace).run()
    assert fast.events == slow.events
    assert summarize(fast, 2.0, 0.1, 0.05) == summarize(slow, 2.0, 0.1, 0.05)
    assert _books(fast) == _books(slow)
    # The run went through what changes a batch.
    engines = [w.engine for w in fast.workers.values() if w.role_name == "decode"]
    assert sum(e.scheduler.num_preemptions for e in engines) > 0
    assert len(fast.finished) > 50
    assert len(fast.shared_gaps) > 1000
