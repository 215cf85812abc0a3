"""Continuous batching: which requests run in the next step, and how many tokens each feeds.

Every step has a token budget. Running requests go first, in admission order: a decoding
request feeds its one new token, a request still in prefill feeds the next chunk of its prompt
(chunked prefill: a chunk may end anywhere). Waiting requests are then admitted while budget,
batch slots and cache blocks allow. Blocks are allocated as positions are reached; when the pool
runs dry the youngest running request is preempted: its blocks and slot are released and it
goes back to the front of the queue to be recomputed from its prompt plus the tokens it already
produced (sampling depends only on seed and position, so the recomputed request continues
exactly as it would have).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deepring.cache.allocator import BlockAllocator, SlotAllocator
from deepring.core.request import Request, Status

if TYPE_CHECKING:
    from deepring.core.prefix import PrefixCache
    from deepring.cost.pacer import Pacer


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # Largest chunk a single request feeds in one step (None: only the step budget limits it).
    max_chunk_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_chunk_tokens is not None and self.max_chunk_tokens < 1:
            raise ValueError("max_chunk_tokens must be >= 1")


@dataclass
class Scheduled:
    request: Request
    num_tokens: int  # tokens fed this step, the drafts included
    # Speculative decoding: the leading request.drafts[:num_drafts] ride after its last token
    # (core.speculative verifies them).
    num_drafts: int = 0

    @property
    def completes(self) -> bool:
        """Whether this chunk reaches the request's last token (so it samples): its last known
        one, or the one a computing step will add (Request.ahead; core.overlap)."""
        r = self.request
        return r.num_cached + self.num_tokens - self.num_drafts == r.num_tokens + r.ahead


def advance(scheduled: list[Scheduled]) -> None:
    """Each request's num_cached counts the rows its chunk writes (a runner calls this as it
    launches the step: the step after is planned from there)."""
    for s in scheduled:
        s.request.num_cached += s.num_tokens


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockAllocator,
        slots: SlotAllocator,
        block_size: int,
    ) -> None:
        self.config = config
        self.blocks = blocks
        self.slots = slots
        self.block_size = block_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.prefix: PrefixCache | None = None  # set by the engine when prefix caching is on
        self.window = 1  # the model's sliding window (replayed chunks need >= 2 rows in it)
        # Chunk sizes from a latency target (cost.pacer), set by the engine when one is given.
        self.pacer: Pacer | None = None
        # Finished requests whose slot and blocks a computing step still uses (core.overlap):
        # freed by release_held once it is done.
        self.held: list[Request] = []

    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def _grow(self, req: Request, n_tokens: int) -> bool:
        need = self._blocks_for(n_tokens) - len(req.blocks)
        if need <= 0:
            return True
        if not self.blocks.can_allocate(need):
            return False
        req.blocks.extend(self.blocks.allocate(need))
        return True

    def release(self, req: Request) -> None:
        if req.blocks:
            self.blocks.free(req.blocks)
            req.blocks = []
        if req.slot is not None:
            self.slots.free(req.slot)
            req.slot = None

    def finish(self, req: Request, reason: str) -> None:
        if req.in_flight:
            self.held.append(req)
        else:
            self.release(req)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = Status.FINISHED
        req.finish_reason = reason

    def release_held(self) -> None:
        """Free what finished requests held once no computing step uses it any more."""
        keep = [r for r in self.held if r.in_flight]
        for r in self.held:
            if not r.in_flight:
                self.release(r)
        self.held = keep

    def _preempt(self, req: Request) -> None:
        self.release(req)
        self.running.remove(req)
        req.num_cached = req.window_floor = req.compress_from = 0
        req.snapshot_at = req.ring_pending = req.draft_from = req.survival = None
        req.drafts = []
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _chunk(self, req: Request, budget: int) -> int:
        """Tokens `req` feeds this step (0: it waits for a step with more budget)."""
        n = min(req.pending, budget)
        if self.config.max_chunk_tokens is not None:
            n = min(n, self.config.max_chunk_tokens)
        if self.pacer is not None:
            n = self.pacer.chunk(req, n)  # the latency target's share of the budget
        if req.snapshot_at is not None and req.num_cached < req.snapshot_at:
            n = min(n, req.snapshot_at - req.num_cached)  # the ring is snapshotted there
        floor = req.window_floor
        if floor and req.num_cached < floor + self.window - 1 and n < 2 <= req.pending:
            return 0  # a replayed window's rows take the prefill kernels (see SeqChunk)
        return n

    def schedule(self, preempt: bool = True) -> list[Scheduled] | None:
        """The next step's requests and chunks. preempt False (a step is still computing, and
        its requests' slots and blocks are in use): None where a request would have to be
        preempted for room, instead of preempting it (the caller plans again once the step is
        done)."""
        budget = self.config.max_num_batched_tokens
        if self.pacer is not None:
            self.pacer.begin(self.running)
        out: list[Scheduled] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._chunk(req, budget)
            if n <= 0:
                i += 1
                continue
            # A decoding request's drafts ride along while the budget allows (they need cache
            # room like any token: rejected ones are rolled back after the step).
            drafts = min(len(req.drafts), budget - 1) if n == req.pending == 1 else 0
            n += drafts
            while not self._grow(req, req.num_cached + n):
                if not preempt:
                    return None
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            if req.status is not Status.RUNNING:
                break
            out.append(Scheduled(req, n, drafts))
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if self.slots.num_free == 0:
                break
            if self.prefix is not None and not self.prefix.ready(req):
                break  # its store read-ahead is still in flight
            slot = self.slots.allocate()
            # A request holding no cache state yet (new, or preempted) takes its longest
            # cached prefix now; a failed admission gives it back (release).
            prefix = self.prefix if req.num_cached == 0 and not req.blocks else None
            if prefix is not None:
                prefix.acquire(req, slot)
            n = self._chunk(req, budget)
            if n == 0 or not self._grow(req, req.num_cached + n):
                self.slots.free(slot)
                if prefix is not None:
                    prefix.release(req)
                if n and not self.running and not out:
                    if not preempt:
                        return None  # (blocks a computing step holds may be freed after it)
                    raise RuntimeError(
                        f"request {req.rid} needs more cache blocks than the pool has"
                    )
                break
            self.waiting.popleft()
            req.slot = slot
            req.status = Status.RUNNING
            self.running.append(req)
            out.append(Scheduled(req, n))
            budget -= n
        return out
