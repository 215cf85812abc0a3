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

What the three need of the batch (is every request steady, the fewest tokens one may still add,
the tokens held, each request's next token) comes from sim.batch, read when the batch changes
rather than before every step; the tokens of a step are SimRunner.token_at's, taken off one
cycle of them (sim.batch.cycle).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from deepring.cost.model import StepShape
from deepring.ipc.messages import Tokens
from deepring.sim import batch
from deepring.sim.runner import PERIOD, SimRunner
from deepring.worker.roles import DecodeRole

# A Tokens message's empty log probability arrays, shared (its defaults make new ones).
_NO_LOGPROBS = {
    "logprobs": np.zeros(0, dtype=np.float32), "top_ids": np.zeros(0, dtype=np.int32),
    "top_logprobs": np.zeros(0, dtype=np.float32),
}  # fmt: skip


@dataclass
class Run:
    start: float
    ends: list[float]  # each step's end, worker time
    shapes: list[StepShape]
    seconds: list[float]


def plan(role: DecodeRole, runner: SimRunner, until: float, min_steps: int = 2) -> Run | None:
    """The run of trivial decode steps from now (None when the next step is not trivial or the
    run would be shorter than min_steps). until: the run ends with the first step that ends at
    or after it (the next load report)."""
    engine = role.engine
    s = engine.scheduler
    if role.pending or s.waiting or not s.running or engine.eos_token_ids:
        return None
    b = batch.current(role, runner)
    if b is None:
        return None
    left = b.left - b.k
    if left - 1 < min_steps:
        return None
    bs = engine.block_size
    running = s.running
    free = engine.blocks.num_free
    batch_size = len(running)
    # Tokens each request can still add in the blocks it holds; step i (from 0) needs a new
    # block for every request with less than i + 1 of that room (and a run is far shorter
    # than a block, so no request needs two). With a free block per request (and every
    # request's blocks holding its tokens) no step runs out: the rooms are not needed.
    rooms = None
    if not (runner.incremental and b.fits and free >= batch_size):
        rooms = sorted([len(r.blocks) * bs - r.num_cached for r in running])
    # Every request cached one more token per step since the batch was read.
    context = float(b.cached + batch_size * b.k)
    t = runner.clock.now
    run = Run(t, [], [], [])
    for i in range(min(left - 1, bs)):
        if rooms is not None and bisect.bisect_left(rooms, i + 1) > free:
            break
        shape = StepShape(batch_size, batch_size, 0.0, context + batch_size * (i + 1))
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
        or role.overlap is not None
    ):  # fmt: skip
        return False
    b = batch.current(role, runner)
    if b is None or not b.plain:  # all steady, and nothing else the engine would act on
        return False
    bs = engine.block_size
    blocks = engine.blocks
    batch_size = len(running)
    if not (runner.incremental and b.fits and blocks.num_free >= batch_size):
        # The scheduler grows every request by a token before the step: the blocks that takes.
        need = 0
        for r in running:
            n = -(-(r.num_cached + 1) // bs) - len(r.blocks)
            if n > 0:
                need += n
        if need > blocks.num_free:
            return False  # someone would be preempted
    k = b.k
    # StepShape.of's sums: integers, exact in a float.
    shape = StepShape(batch_size, batch_size, 0.0, float(b.cached + batch_size * k + batch_size))
    clock = runner.clock
    t0 = clock.now
    seconds = runner.duration(shape)
    clock.now += seconds
    runner.last = (shape, seconds)
    runner.last_decodes = batch_size
    engine.num_steps += 1
    # Every request's SimRunner.token_at(seed, length) (its tokens are k past the batch's start).
    kk = k % PERIOD
    cyc, cyc_array = batch.cycle(1)
    allocate = blocks.allocate
    for r, start in zip(running, b.start, strict=True):
        c = r.num_cached
        if c >= len(r.blocks) * bs:  # the block its next token goes into
            r.blocks.extend(allocate(-(-(c + 1) // bs) - len(r.blocks)))
        r.num_cached = c + 1
        r.output_ids.append(cyc[start + kk])
    if b.thinks:
        for r in running:
            if r.output_ids[-1] == r.params.think_end_id:
                r.thinking_ended = True
    # The role's TokensOut, for the one frontend link: the requests it knows, in batch order.
    offsets = [o + k for o in b.offsets]
    ids = cyc_array[b.start_np + kk]
    if not b.everyone:
        ids = ids[b.keep]
    stops = []
    if b.left - k <= 1:  # some request reaches max_tokens with this token
        origin_of = role.origins.get
        stops = [(r, origin_of(r.rid)) for r in running
                 if len(r.output_ids) >= r.params.max_tokens]  # fmt: skip
    b.advance(1)
    engine.num_generated += batch_size
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
    if b.fronts:
        # b.fronts itself: nothing changes a message's lists once it is sent.
        msg = Tokens(
            worker=role.worker_id, rids=b.fronts, offsets=offsets, counts=[1] * len(ids),
            token_ids=ids, finished=finished, cache_hits=[], errors=[], logprob_k=[],
            **_NO_LOGPROBS,
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
    b = batch.current(role, runner)
    if b is None:  # nothing may step a worker during its run
        raise RuntimeError(f"{role.worker_id}: its batch changed during a run")
    # Every request's tokens of the run (SimRunner.token_at, k past the batch's start).
    k = b.k
    kk = k % PERIOD
    cyc, cyc_array = batch.cycle(steps)
    bs, allocate = engine.block_size, engine.blocks.allocate
    for r, start in zip(running, b.start, strict=True):
        c = r.num_cached + steps
        r.num_cached = c
        r.output_ids += cyc[start + kk : start + kk + steps]
        if c > len(r.blocks) * bs:
            r.blocks.extend(allocate(-(-c // bs) - len(r.blocks)))  # engine.blocks_for
    b.advance(steps)
    engine.cost.observe_many(run.shapes[:steps], run.seconds[:steps])
    engine.num_steps += steps
    engine.num_generated += steps * len(running)
    engine.step_seconds += sum(run.seconds[:steps])
    engine.last_step = (run.shapes[steps - 1], run.seconds[steps - 1])
    runner.clock.now = run.ends[steps - 1]
    runner.last = engine.last_step
    runner.last_decodes = len(running)
    if not b.fronts:
        return None
    # Row j: request j's tokens.
    table = cyc_array[(b.start_np if b.everyone else b.start_np[b.keep])[:, None]
                      + np.arange(kk, kk + steps)]  # fmt: skip
    return Tokens(
        worker=role.worker_id, rids=b.fronts, offsets=[o + k for o in b.offsets],
        counts=[steps] * len(b.fronts), token_ids=table.ravel(), finished=[], cache_hits=[],
        errors=[], logprob_k=[], **_NO_LOGPROBS,
    )  # fmt: skip
