"""Which prefill worker computes a request's prompt, and which decode worker generates from it.

Prefill cost: the prompt tokens that worker would have to compute (uncached tokens: without a
prefix cache hit, the whole prompt) plus the prompt tokens already queued on it. The cheapest
worker wins; ties go to the worker with fewer requests in hand, then round-robin.

Decode: the worker with the most headroom, where headroom is the smaller of its free-slot
fraction and its free-block fraction; a worker that can take the request now (a free slot and
enough blocks for the prompt and the next token) beats one that cannot. When none can, the
best one still gets it and admits it when room frees up (the frontend's queue limit bounds
how many wait).

The frontend keeps these loads itself, updated on every submit, first token and finish, so a
burst of requests spreads out before any worker has reported.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deepring.cost.model import StepCost


@dataclass(frozen=True)
class Reported:
    """What a decode worker's last load report said it holds."""

    requests: int  # running + waiting to be admitted
    tokens: int  # context of its running requests
    blocks: int  # KV blocks in use


@dataclass
class WorkerLoad:
    worker: str
    ready: bool = True
    requests: int = 0  # requests in hand (frontend's count)
    queued_tokens: int = 0  # prefill: prompt tokens submitted and not prefilled yet
    num_slots: int = 1  # decode: batch slots
    num_blocks: int = 1  # decode: KV blocks
    used_tokens: int = 0  # decode: tokens held by its requests (prompt + generated)
    # For the cost router (routing.balance), kept by the registry from the worker's reports:
    cost: StepCost | None = None  # its step-time model (None: not reported yet)
    chunk: int = 2048  # prefill: its step's token budget
    backlog_s: float = 0.0  # prefill: predicted seconds of prompt work ahead of a new request
    reported: Reported | None = None  # decode: its last report
    in_prefill: int = 0  # decode: this frontend's requests for it still in prefill
    in_prefill_tokens: int = 0  # and their prompt tokens

    def free_slots(self) -> int:
        return max(0, self.num_slots - self.requests)

    def free_blocks(self, block_size: int) -> int:
        # Every request holds a partly filled last block, hence + requests.
        used = -(-self.used_tokens // block_size) + self.requests
        return max(0, self.num_blocks - used)

    def estimates(self, block_size: int) -> tuple[int, int, int]:
        """Decode load (requests, tokens, KV blocks), each the larger of the frontend's view
        and the worker's report (plus what the report cannot contain yet: requests still in
        prefill). One call: the cost router reads all three of every decode worker on every
        route."""
        requests, own = self.requests, -(-self.used_tokens // block_size) + self.requests
        r = self.reported
        if r is None:
            return max(requests, 0), max(self.used_tokens, 0), own
        return (
            max(requests, r.requests + self.in_prefill),
            max(self.used_tokens, r.tokens + self.in_prefill_tokens),
            max(own, r.blocks + -(-self.in_prefill_tokens // block_size) + self.in_prefill),
        )


class Router:
    def __init__(self, block_size: int = 128) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        # One rotation per role: a shared one would advance twice per request and, with two
        # workers, always break ties the same way.
        self._prefill_turn = itertools.count()
        self._decode_turn = itertools.count()

    def pick_prefill(
        self,
        loads: Iterable[WorkerLoad],
        uncached_tokens: int | Mapping[str, int],
        prompt_tokens: int | None = None,
    ) -> WorkerLoad | None:
        """The prefill worker with the least work after taking this request. uncached_tokens:
        the prompt tokens each worker would compute (one number when it is the same for all);
        prompt_tokens (the whole prompt) is not used by this router."""
        best, best_key = None, None
        turn = next(self._prefill_turn)
        ready = [w for w in loads if w.ready]
        for i, w in enumerate(ready):
            own = (
                uncached_tokens
                if isinstance(uncached_tokens, int)
                else uncached_tokens.get(w.worker, 0)
            )
            key = (w.queued_tokens + own, w.requests, (i - turn) % len(ready))
            if best_key is None or key < best_key:
                best, best_key = w, key
        return best

    def pick_decode(self, loads: Iterable[WorkerLoad], prompt_tokens: int) -> WorkerLoad | None:
        """The decode worker with the most headroom for a request of prompt_tokens tokens."""
        need = -(-(prompt_tokens + 1) // self.block_size)
        best, best_key = None, None
        turn = next(self._decode_turn)
        ready = [w for w in loads if w.ready]
        for i, w in enumerate(ready):
            slots, blocks = w.free_slots(), w.free_blocks(self.block_size)
            fits = slots > 0 and blocks >= need
            headroom = min(slots / max(1, w.num_slots), blocks / max(1, w.num_blocks))
            key = (not fits, -headroom, (i - turn) % len(ready))
            if best_key is None or key < best_key:
                best, best_key = w, key
        return best
