"""A decode worker's running batch as sim.fastforward sees it, carried from step to step.

Most of a busy decode worker's steps are steady: every running request feeds its one next
token (sim.fastforward). What fastforward needs of such a batch (the fewest tokens any request
may still add, the tokens it holds, each request's next token, frontend id and output offset)
used to be read from every request before every step, several times over: that was most of a
simulation's time. A `Batch` holds those figures per request as they were when it was read,
and counts the steady steps fastforward applied since (`k`): each adds one token to every
request, so the figures now follow from those.

It is valid while the running list holds the same requests and the engine took no other step
(its step count is the one the batch expects). When only the membership changed (a handoff
admitted, a request finished: fastforward's own steps and the role's admission, which leave the
other requests alone), `current` carries the staying requests' figures over and reads only the
new ones; after any step through the scheduler it reads every request again. With
`SimRunner.incremental` off it reads them all before every step, which is the check
(tests/engine/test_sim_incremental.py) that the two agree.
"""

from __future__ import annotations

import numpy as np

from deepring.core.engine import EngineCore
from deepring.core.request import Request
from deepring.sim.runner import PERIOD, SimRunner
from deepring.worker.roles import DecodeRole


class Batch:
    __slots__ = (
        "cached", "everyone", "fits", "fronts", "k", "keep", "left", "num_steps", "offsets",
        "plain", "reqs", "rows", "start", "start_np", "thinks",
    )  # fmt: skip

    def __init__(self, reqs: list[Request], rows: list[tuple], num_steps: int) -> None:
        self.reqs = reqs  # a copy of the running list it was read from
        # Per request, at k = 0 (`_row`): (cached tokens, tokens it may still add, its next
        # token's index in `cycle`, output length, frontend id or None, its blocks hold its
        # cached tokens, plain, has a think_end_id).
        self.rows = rows
        self.num_steps = num_steps  # the engine's step count it expects
        self.k = 0  # steady steps applied since
        self.cached = sum([row[0] for row in rows])  # at k = 0, of all the requests
        self.left = min([row[1] for row in rows], default=0)  # at k = 0, the fewest
        self.start = [row[2] for row in rows]
        self.start_np = np.array(self.start, dtype=np.int64)
        fronts = [row[4] for row in rows]
        # The requests with a frontend id: the ids, their output lengths at k = 0, indices.
        self.everyone = None not in fronts
        self.keep = list(range(len(rows))) if self.everyone else [
            j for j, f in enumerate(fronts) if f is not None
        ]  # fmt: skip
        self.fronts = fronts if self.everyone else [fronts[j] for j in self.keep]
        self.offsets = [rows[j][3] for j in self.keep]
        # Every request's blocks hold its cached tokens (the engine's invariant): a steady step
        # then needs at most one new block per request, and a worker with a free block per
        # request needs no per-request count.
        self.fits = all([row[5] for row in rows])
        # No drafts, grammar or log probabilities: fastforward.step may apply its steps.
        self.plain = all([row[6] for row in rows])
        self.thinks = any([row[7] for row in rows])  # a token may end a request's thinking

    def advance(self, steps: int) -> None:
        """`steps` steady steps were applied to every request."""
        self.k += steps
        self.num_steps += steps


def _row(r: Request, bs: int, origin_of) -> tuple | None:
    """Batch.rows' entry for r now; None unless it is steady (has exactly its next token to
    feed and no stop token ids)."""
    c, n_out = r.num_cached, len(r.output_ids)
    n = len(r.prompt_ids) + n_out
    p = r.params
    if n - c != 1 or p.stop_token_ids:
        return None
    origin = origin_of(r.rid)
    return (
        c, p.max_tokens - n_out, (r.seed + n) % PERIOD, n_out,
        origin[1] if origin is not None else None, c <= len(r.blocks) * bs,
        not (r.drafts or r.grammar is not None or r.new_logprob is not None),
        p.think_end_id is not None,
    )  # fmt: skip


def read(role: DecodeRole, engine: EngineCore, old: Batch | None = None) -> Batch | None:
    """The batch of the running requests (None unless every one is steady). old: a batch of
    this engine that is valid but for its membership: the requests it holds too are not read
    again (only fastforward stepped them since: its figures, k steps on)."""
    reqs = list(engine.scheduler.running)
    bs, origin_of = engine.block_size, role.origins.get
    rows = []
    # The running list keeps its order (finished requests leave it, admitted ones join at its
    # end): old's requests are found in one pass.
    j, olds = 0, old.reqs if old is not None else []
    for r in reqs:
        while j < len(olds) and olds[j] is not r:
            j += 1
        if j < len(olds):
            c, left, start, n_out, front, fits, plain, thinks = old.rows[j]
            k = old.k
            # A step of fastforward's leaves a request's blocks holding its tokens.
            rows.append((c + k, left - k, (start + k) % PERIOD, n_out + k, front,
                         fits or k > 0, plain, thinks))  # fmt: skip
            j += 1
            continue
        row = _row(r, bs, origin_of)
        if row is None:
            return None
        rows.append(row)
    return Batch(reqs, rows, engine.num_steps)


def current(role: DecodeRole, runner: SimRunner) -> Batch | None:
    """The worker's batch now (read again when it changed; None when it is not steady)."""
    engine = role.engine
    b = runner.batch
    valid = b is not None and runner.incremental and b.num_steps == engine.num_steps
    if valid and b.reqs == engine.scheduler.running:  # the same requests, by identity
        return b
    b = runner.batch = read(role, engine, b if valid else None)
    return b


def held_tokens(role: DecodeRole, runner: SimRunner) -> int:
    """The tokens the running requests hold (sum of num_tokens): from the batch while it is
    valid (each request's cached tokens and its next one), else from the requests."""
    engine = role.engine
    running = engine.scheduler.running
    b = runner.batch
    if (
        b is not None and runner.incremental and b.num_steps == engine.num_steps
        and b.reqs == running
    ):  # fmt: skip
        return b.cached + len(running) * (b.k + 1)
    return sum(r.num_tokens for r in running)


class _Cycle:
    """SimRunner.token_at(x, 0) for x from 0, as a list (a steady step's tokens are slices of
    it: the same int objects for every request, where new ones per token would fill the
    memory) and as an int32 array (a Tokens message's ids are one indexing of it)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.array = np.zeros(0, dtype=np.int32)

    def __call__(self, steps: int) -> tuple[list[int], np.ndarray]:
        """Long enough for `steps` tokens from any start and k (both modulo PERIOD)."""
        n = 2 * PERIOD + steps
        if len(self.tokens) < n:
            self.tokens = [SimRunner.token_at(x, 0) for x in range(n)]
            self.array = np.array(self.tokens, dtype=np.int32)
        return self.tokens, self.array


cycle = _Cycle()
