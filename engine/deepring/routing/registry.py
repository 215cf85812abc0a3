"""The frontend's book of workers: who is registered, what each reported, and the load the
router reads.

Loads are kept here, updated on every submit, first token, new token and finish, so a burst of
requests spreads out before any worker has reported; the workers' own Stats are kept beside
them for /health and /metrics. This module does no I/O: the frontend's ring client sends and
receives, and tells the registry what happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from deepring.config import ROLES
from deepring.ipc.messages import Health, Stats
from deepring.routing.router import Router, WorkerLoad


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


class WorkerRegistry:
    def __init__(self, expect_prefill: int, expect_decode: int) -> None:
        self.expect = {"prefill": expect_prefill, "decode": expect_decode}
        self.workers: dict[str, WorkerState] = {}
        self.router = Router()
        self.seen_pids: set[int] = set()  # workers that announced themselves ready

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
        )
        if role == "decode" and "block_size" in info:
            self.router.block_size = int(info["block_size"])
        w = WorkerState(wid, role, msg.gen, msg.pid, info, time.monotonic(), load, route=route)
        self.workers[wid] = w
        self.seen_pids.add(msg.pid)
        return w

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

    def route(
        self, n_tokens: int, uncached: int | None = None
    ) -> tuple[WorkerState, WorkerState] | None:
        """The prefill and decode workers for a prompt of n_tokens of which `uncached` must be
        computed (default all; None: no ready pair)."""
        todo = n_tokens if uncached is None else uncached
        pre = self.router.pick_prefill([w.load for w in self.ready_workers("prefill")], todo)
        dec = self.router.pick_decode([w.load for w in self.ready_workers("decode")], n_tokens)
        if pre is None or dec is None:
            return None
        return self.workers[pre.worker], self.workers[dec.worker]

    def assign(
        self, rid: int, n_tokens: int, p: WorkerState, d: WorkerState, uncached: int | None = None
    ) -> None:
        """A request was sent to prefill worker p (which computes `uncached` of its n_tokens,
        default all), to be handed to decode worker d."""
        p.rids.add(rid)
        p.load.requests += 1
        p.load.queued_tokens += n_tokens if uncached is None else uncached
        d.rids.add(rid)
        d.load.requests += 1
        d.load.used_tokens += n_tokens

    def prefilled(self, rid: int, n_tokens: int, p: WorkerState) -> None:
        """The request's first token is in: its prompt is off p's queue."""
        if rid in p.rids:
            p.rids.discard(rid)
            p.load.requests -= 1
            p.load.queued_tokens -= n_tokens

    def grew(self, rid: int, decode: str | None, count: int) -> None:
        """The request holds `count` more tokens on its decode worker."""
        d = self.get(decode)
        if d is not None and rid in d.rids:
            d.load.used_tokens += count

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
        d = self.get(decode)
        if d is not None and rid in d.rids:
            d.rids.discard(rid)
            d.load.requests -= 1
            d.load.used_tokens -= n_tokens + received
