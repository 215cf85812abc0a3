"""Runs of pure decode steps in one go: what makes hundreds of simulated workers cheap.

Most of a decode worker's steps are trivial for the scheduler: nothing waits, every running
request feeds its one next token, nobody finishes, the blocks suffice. Stepping through them
one by one would spend the simulation's time re-running the same decisions. When a decode
worker is in that state, `plan` computes the next run of such steps ahead (their shapes and
times from the worker's step-time model: the context grows by one token per request per step)
up to the first of: the step before a request would finish, the step that ends past its next
load report, or the blocks running out; `apply` then puts the run's effect on the engine at
once: tokens, cached positions, blocks, step counters, the online fit's observations, and one
Tokens message carrying every token of the run (the cluster stamps each token with its own
step's end). A message reaching the worker during a run cuts it at the first step that ends
after the message's arrival, as the real worker loop would take it there.

What differs from stepping one by one (tests/engine/test_sim.py checks the two against each
other): the frontend hears a run's tokens when the run ends, at most one report interval late,
and block ids are handed out in another order.

`step` is one such step outside a run (the step that crosses a load report, admits a handoff or
finishes a request): what role.step would do, float for float, without the scheduler's
per-request objects; the simulation is the same with or without it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from deepring.core.engine import EngineCore
from deepring.cost.model import StepShape
from deepring.ipc.messages import Tokens
from deepring.sim.runner import SimRunner
from deepring.worker.roles import DecodeRole


@dataclass
class Run:
    start: float
    ends: list[float]  # each step's end, worker time
    shapes: list[StepShape]
    seconds: list[float]


def _steady(role: DecodeRole, engine: EngineCore) -> bool:
    s = engine.scheduler
    if role.pending or s.waiting or not s.running or engine.eos_token_ids:
        return False
    # Request.pending == 1, spelled out: this runs for every request before most steps.
    for r in s.running:
        if len(r.prompt_ids) + len(r.output_ids) - r.num_cached != 1 or r.params.stop_token_ids:
            return False
    return True


def plan(role: DecodeRole, runner: SimRunner, until: float, min_steps: int = 2) -> Run | None:
    """The run of trivial decode steps from now (None when the next step is not trivial or the
    run would be shorter than min_steps). until: the run ends with the first step that ends at
    or after it (the next load report)."""
    engine = role.engine
    if not _steady(role, engine):
        return None
    running = engine.scheduler.running
    left = min([r.params.max_tokens - len(r.output_ids) for r in running])
    if left - 1 < min_steps:
        return None
    bs = engine.block_size
    # Tokens each request can still add in the blocks it holds; step i (from 0) needs a new
    # block for every request with less than i + 1 of that room (and a run is far shorter
    # than a block, so no request needs two).
    cached = [r.num_cached for r in running]
    rooms = sorted([len(r.blocks) * bs - c for r, c in zip(running, cached, strict=True)])
    free = engine.blocks.num_free
    batch, context = len(running), float(sum(cached))
    t = runner.clock.now
    run = Run(t, [], [], [])
    for i in range(min(left - 1, bs)):
        if bisect.bisect_left(rooms, i + 1) > free:
            break
        shape = StepShape(batch, batch, 0.0, context + batch * (i + 1))
        seconds = runner.duration(shape)
        t += seconds
        run.ends.append(t)
        run.shapes.append(shape)
        run.seconds.append(seconds)
        if t >= until:
            break
    return run if len(run.ends) >= min_steps else None


def step(role: DecodeRole, runner: SimRunner) -> bool:
    """role.step() where the step is steady (as `plan` asks, except that requests may reach
    max_tokens: they finish as in the engine); False where it is not, and role.step() must do
    it (this has done its role.admit() then, which that repeats without effect: the admission
    state is unchanged). It changes the engine, the fit and the clock exactly as role.step
    would, and sends the same Tokens message."""
    if role.pending:  # admit() does nothing else (its error message would be empty)
        role.admit()
    engine = role.engine
    s = engine.scheduler
    running = s.running
    if (
        role.pending or s.waiting or not running or engine.eos_token_ids
        or len(running) > s.config.max_num_batched_tokens
        or engine.spec is not None or engine.prefix is not None
        or engine.on_compute is not None or role.outbox is not None
    ):  # fmt: skip
        return False
    bs = engine.block_size
    grow, need, cached = [], 0, 0
    for r in running:  # _steady's test, and what else the engine would act on
        c = r.num_cached
        if (
            len(r.prompt_ids) + len(r.output_ids) - c != 1 or r.params.stop_token_ids
            or r.drafts or r.grammar is not None or r.new_logprob is not None
        ):  # fmt: skip
            return False
        # The scheduler grows every request by a token before the step.
        n = -(-(c + 1) // bs) - len(r.blocks)
        grow.append(n)
        if n > 0:
            need += n
        cached += c
    blocks = engine.blocks
    if need > blocks.num_free:
        return False  # someone would be preempted
    batch = len(running)
    # StepShape.of's sums: integers, exact in a float.
    shape = StepShape(batch, batch, 0.0, float(cached + batch))
    clock = runner.clock
    t0 = clock.now
    seconds = runner.duration(shape)
    clock.now += seconds
    runner.last = (shape, seconds)
    runner.last_decodes = batch
    engine.num_steps += 1
    token_at, origin_of = runner.token_at, role.origins.get
    rids, offsets, ids, stops = [], [], [], []
    for r, n in zip(running, grow, strict=True):
        if n > 0:
            r.blocks.extend(blocks.allocate(n))
        r.num_cached += 1
        out = r.output_ids
        token = token_at(r.seed, len(r.prompt_ids) + len(out))
        out.append(token)
        p = r.params
        if token == p.think_end_id:
            r.thinking_ended = True
        origin = origin_of(r.rid)
        if origin is not None:  # the role's TokensOut, for the one frontend link
            rids.append(origin[1])
            offsets.append(len(out) - 1)
            ids.append(token)
        if len(out) >= p.max_tokens:
            stops.append((r, origin))
    engine.num_generated += batch
    finished = []
    for r, origin in stops:
        engine.finish(r, "length")
        if origin is not None:
            finished.append([origin[1], r.finish_reason or "stop", len(r.output_ids)])
            role.origins.pop(r.rid)
    # The engine's own arithmetic: its step time is a difference of clock readings.
    took = clock.now - t0
    engine.compute_seconds += took
    engine.last_phases = (t0, t0, clock.now, clock.now)
    engine.step_seconds += took
    engine.cost.observe(shape, took)
    engine.last_step = (shape, took)
    if rids:
        msg = Tokens(
            worker=role.worker_id, rids=rids, offsets=offsets, counts=[1] * len(rids),
            token_ids=np.asarray(ids, dtype=np.int32), finished=finished, cache_hits=[],
            errors=[],
        )  # fmt: skip
        role.link.to_frontend(msg)
    return True


def cut(run: Run, at: float) -> int:
    """How many steps of the run are done by the first step end at or after `at`."""
    for i, end in enumerate(run.ends):
        if end >= at:
            return i + 1
    return len(run.ends)


def apply(role: DecodeRole, runner: SimRunner, run: Run, steps: int) -> Tokens | None:
    """Put the first `steps` steps of the run on the engine; the Tokens message they send."""
    engine = role.engine
    running = engine.scheduler.running
    # Every request's tokens of the run at once: row j holds request j's (SimRunner.token_at).
    firsts = [r.seed + len(r.prompt_ids) + len(r.output_ids) for r in running]
    table = runner.token_at(np.array(firsts, dtype=np.int64)[:, None] + np.arange(steps), 0)
    bs, blocks, origin_of = engine.block_size, engine.blocks, role.origins.get
    rids, offsets, keep = [], [], []
    for j, (r, row) in enumerate(zip(running, table.tolist(), strict=True)):
        out = r.output_ids
        origin = origin_of(r.rid)
        if origin is not None:
            rids.append(origin[1])
            offsets.append(len(out))
            keep.append(j)
        r.num_cached += steps
        out.extend(row)
        need = -(-r.num_cached // bs) - len(r.blocks)  # engine.blocks_for
        if need > 0:
            r.blocks.extend(blocks.allocate(need))
    engine.cost.observe_many(run.shapes[:steps], run.seconds[:steps])
    engine.num_steps += steps
    engine.num_generated += steps * len(running)
    engine.step_seconds += sum(run.seconds[:steps])
    engine.last_step = (run.shapes[steps - 1], run.seconds[steps - 1])
    runner.clock.now = run.ends[steps - 1]
    runner.last = engine.last_step
    runner.last_decodes = len(running)
    if not rids:
        return None
    return Tokens(
        worker=role.worker_id, rids=rids, offsets=offsets, counts=[steps] * len(rids),
        token_ids=(table if len(keep) == len(running) else table[keep]).astype(np.int32).ravel(),
        finished=[], cache_hits=[], errors=[],
    )  # fmt: skip
