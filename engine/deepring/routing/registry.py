"""The frontend's book of workers: who is registered, what each reported, and the load the
router reads.

Loads are kept here, updated on every submit, first token, new token and finish, so a burst of
requests spreads out before any worker has reported; the workers' own Stats are kept beside
them for /health and /metrics. This module does no I/O: the frontend's ring client sends and
receives, and tells the registry what happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from deepring.config import ROLES, ROUTERS
from deepring.cost.model import WARMUP_STEPS, StepCost
from deepring.cost.presets import TINY_CPU
from deepring.ipc.messages import Health, Stats
from deepring.routing.balance import CostRouter
from deepring.routing.router import Reported, Router, WorkerLoad


@dataclass(eq=False)
class WorkerState:
    id: str
    role: str
    gen: int  # incarnation: a restarted worker comes back with a new one
    pid: int
    info: dict  # what it reported when ready (limits, tokenizer, model family, ...)
    last_seen: float
    load: WorkerLoad
    stats: Stats | None = None
    rids: set[int] = field(default_factory=set)  # requests it holds
    route: bytes = b""  # the ZeroMQ routing id of this incarnation (ipc.validate.worker_route)
    stats_at: float = 0.0  # when `stats` arrived
    # Prefill: the predicted seconds of each request sent to it and not prefilled yet, and
    # when it was sent (work sent after its last report is not in that report's backlog).
    booked: dict[int, tuple[float, float]] = field(default_factory=dict)
    leaving: bool = False  # it said it is draining: no new requests, it finishes its own


class WorkerRegistry:
    def __init__(
        self,
        expect_prefill: int,
        expect_decode: int,
        router: str = "tokens",
        tbt_target_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """router: "tokens" (routing.router: queued tokens, free slots and blocks) or "cost"
        (routing.balance: the workers' step-time models and reports)."""
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
        self.expect = {"prefill": expect_prefill, "decode": expect_decode}
        self.workers: dict[str, WorkerState] = {}
        self.router: Router | CostRouter = (
            CostRouter(tbt_target_s=tbt_target_s) if router == "cost" else Router()
        )
        self.clock = clock
        self.seen_pids: set[int] = set()  # workers that announced themselves ready
        # Requests not prefilled yet: rid -> (its decode worker, prompt tokens), which that
        # worker's reports cannot contain.
        self._in_prefill: dict[int, tuple[str, int]] = {}

    # ---- membership ----------------------------------------------------------------------------

    def add(self, wid: str, msg: Health, route: bytes = b"") -> WorkerState:
        """Register a worker that announced itself ready (from routing id `route`).
        ValueError for an unknown role."""
        info = dict(msg.info)
        role = info.get("role")
        if role not in ROLES:
            raise ValueError(f"worker {wid} announced an unknown role {role!r}")
        load = WorkerLoad(
            worker=wid,
            num_slots=int(info.get("num_slots", 1)),
            num_blocks=int(info.get("num_blocks", 1)),
            chunk=int(info.get("max_num_batched_tokens", 2048)),
        )
        if role == "decode" and "block_size" in info:
            self.router.block_size = int(info["block_size"])
        w = WorkerState(wid, role, msg.gen, msg.pid, info, self.clock(), load, route=route)
        self.workers[wid] = w
        self.seen_pids.add(msg.pid)
        # A worker that joins beyond the expected count (a role command started at run time)
        # is expected from now on: losing it later is a fault.
        ready = len(self.ready_workers(role))
        self.expect[role] = max(self.expect[role], ready)
        return w

    def leave(self, w: WorkerState) -> None:
        """w drains to leave (SIGTERM): the routers pass it over from now on, and its role
        expects one worker less (never fewer than one), so that a planned departure does not
        read as a fault."""
        if w.leaving:
            return
        w.leaving = True
        w.load.ready = False
        self.expect[w.role] = max(1, self.expect[w.role] - 1)

    def remove(self, wid: str) -> WorkerState | None:
        return self.workers.pop(wid, None)

    def get(self, wid: str | None) -> WorkerState | None:
        return self.workers.get(wid) if wid is not None else None

    def silent(self, now: float, timeout: float) -> list[WorkerState]:
        """Workers not heard from for longer than `timeout` seconds."""
        return [w for w in self.workers.values() if now - w.last_seen > timeout]

    def ready_workers(self, role: str) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.role == role and w.load.ready]

    @property
    def ready(self) -> bool:
        return all(len(self.ready_workers(r)) >= n for r, n in self.expect.items())

    @property
    def capacity(self) -> int:
        """Requests the ready decode workers can run at once."""
        return sum(w.load.num_slots for w in self.ready_workers("decode"))

    def info(self, key: str):
        """A fact every worker reports the same (max_model_len, tokenizer, eos ids, ...)."""
        for w in self.workers.values():
            if key in w.info:
                return w.info[key]
        return None

    # ---- load bookkeeping ----------------------------------------------------------------------

    def report(self, w: WorkerState, msg: Stats) -> None:
        """A load report from w (checked by ipc.validate: its step cost parses)."""
        w.stats = msg
        w.stats_at = self.clock()
        # Before its first measured steps a worker reports its prior: no measurement, and the
        # routers assume it runs like its measured peers (routing.balance) rather than as the
        # prior says (a worker judged slow on no evidence would get nothing to be measured on).
        measured = msg.steps > WARMUP_STEPS
        w.load.cost = StepCost.from_wire(msg.step_cost) if measured else None
        if w.role == "decode":
            w.load.reported = Reported(
                msg.running + msg.waiting, msg.context_tokens, msg.used_blocks
            )

    def backlog_s(self, w: WorkerState, now: float) -> float:
        """Predicted seconds of prompt work ahead of a request sent to prefill worker w now:
        its last report's backlog less the time since (it has been working on it), plus what
        was sent to it that the report could not count (sent after the worker last took its
        messages: Stats.lag_s)."""
        if w.stats is None:
            return sum(s for s, _ in w.booked.values())
        # The report counts what the worker had taken in before its last step.
        covered = w.stats_at - w.stats.lag_s
        since = sum(s for s, at in w.booked.values() if at >= covered)
        return max(0.0, w.stats.backlog_s - (now - w.stats_at)) + since

    def route(
        self, n_tokens: int, uncached: int | None = None
    ) -> tuple[WorkerState, WorkerState] | None:
        """The prefill and decode workers for a prompt of n_tokens of which `uncached` must be
        computed (default all; None: no ready pair)."""
        todo = n_tokens if uncached is None else uncached
        prefill = self.ready_workers("prefill")
        if isinstance(self.router, CostRouter):
            now = self.clock()
            for w in prefill:
                w.load.backlog_s = self.backlog_s(w, now)
        pre = self.router.pick_prefill([w.load for w in prefill], todo, n_tokens)
        dec = self.router.pick_decode([w.load for w in self.ready_workers("decode")], n_tokens)
        if pre is None or dec is None:
            return None
        return self.workers[pre.worker], self.workers[dec.worker]

    def assign(
        self, rid: int, n_tokens: int, p: WorkerState, d: WorkerState, uncached: int | None = None
    ) -> None:
        """A request was sent to prefill worker p (which computes `uncached` of its n_tokens,
        default all), to be handed to decode worker d."""
        todo = n_tokens if uncached is None else uncached
        p.rids.add(rid)
        p.load.requests += 1
        p.load.queued_tokens += todo
        model = p.load.cost or TINY_CPU  # CostRouter's fallback too
        seconds = model.prompt_seconds(todo, n_tokens - todo, p.load.chunk)
        p.booked[rid] = (seconds, self.clock())
        d.rids.add(rid)
        d.load.requests += 1
        d.load.used_tokens += n_tokens
        d.load.in_prefill += 1
        d.load.in_prefill_tokens += n_tokens
        self._in_prefill[rid] = (d.id, n_tokens)

    def prefilled(self, rid: int, n_tokens: int, p: WorkerState) -> None:
        """The request's first token is in: its prompt is off p's queue."""
        if rid in p.rids:
            p.rids.discard(rid)
            p.load.requests -= 1
            p.load.queued_tokens -= n_tokens
            p.booked.pop(rid, None)
        self._left_prefill(rid)

    def _left_prefill(self, rid: int) -> None:
        """The request is off its prefill worker: its decode worker's reports count it now."""
        entry = self._in_prefill.pop(rid, None)
        if entry is not None:
            d = self.get(entry[0])
            if d is not None:
                d.load.in_prefill -= 1
                d.load.in_prefill_tokens -= entry[1]

    def grew(self, rid: int, decode: str | None, count: int) -> None:
        """The request holds `count` more tokens on its decode worker."""
        d = self.get(decode)
        if d is not None and rid in d.rids:
            d.load.used_tokens += count

    def grew_many(self, rids: list[int], decode: str | None, count: int) -> None:
        """grew(rid, decode, count) for each of `rids` (a message's requests on one decode
        worker)."""
        d = self.get(decode)
        if d is not None:
            held = d.rids
            d.load.used_tokens += count * sum([rid in held for rid in rids])

    def release(
        self,
        rid: int,
        n_tokens: int,
        received: int,
        prefill: str | None,
        decode: str | None,
        uncached: int | None = None,
    ) -> None:
        """Take a request off its workers' books (n_tokens: its prompt as submitted, of which
        `uncached` were charged to the prefill worker (default all); received: its output
        tokens since)."""
        p = self.get(prefill)
        if p is not None:
            self.prefilled(rid, n_tokens if uncached is None else uncached, p)
        self._left_prefill(rid)
        d = self.get(decode)
        if d is not None and rid in d.rids:
            d.rids.discard(rid)
            d.load.requests -= 1
            d.load.used_tokens -= n_tokens + received
