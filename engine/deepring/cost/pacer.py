"""Chunk sizes from a latency target: how many prompt tokens a step may take.

A step that carries decode tokens (a mixed step) makes every decoding request wait for it, so
its time is a time between tokens. With a TBT target, each prefill chunk in a mixed step is the
largest that keeps the step's predicted time (cost.model, fitted on this worker's own steps)
under the target; a step without decode tokens keeps the fixed token budget (a prefill worker
in a disaggregated deployment: nobody waits between tokens there, and bigger steps are cheaper
per token). The token budget (`max_num_batched_tokens`) stays the upper bound of every step.

Two exceptions:
- progress: when the decode tokens alone already exceed the target, the first prefill chunk of
  the step still gets `min_chunk` tokens, so a prompt never starves behind a large batch;
- TTFT: with a TTFT target, a prompt whose remaining tokens cannot be done by its deadline
  (first seen + target) in chunks of the TBT-bound size gets the smallest larger chunk that
  makes it, up to the token budget. One that cannot make its deadline even at the budget keeps
  the TBT-bound chunk: it is late anyway, and the decoding requests should not pay for it.

The scheduler calls `begin` once per step with its running requests and `chunk` for every
request it is about to feed, in the order it feeds them (core.scheduler).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepring.cost.model import StepCost, StepShape, chunk_pairs


@dataclass(frozen=True)
class PacerConfig:
    tbt_target_s: float
    ttft_target_s: float | None = None
    min_chunk: int = 16

    def __post_init__(self) -> None:
        if not self.tbt_target_s > 0:
            raise ValueError("the TBT target must be > 0")
        if self.ttft_target_s is not None and not self.ttft_target_s > 0:
            raise ValueError("the TTFT target must be > 0")
        if self.min_chunk < 1:
            raise ValueError("min_chunk must be >= 1")


class Pacer:
    def __init__(
        self,
        config: PacerConfig,
        model: Callable[[], StepCost],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.model = model
        self.clock = clock
        self._seen: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._shape = StepShape()
        self._reserved: set[int] = set()
        self._cost = model()
        self._now = 0.0
        self._granted = False
        self.mixed_steps = 0  # steps that carried decode tokens (and were paced)

    def begin(self, running: list) -> None:
        """A new step: the decode tokens of `running` are counted in it up front (they are fed
        whatever their place in the order), so the prefill chunks get what they leave."""
        self._shape = StepShape()
        self._reserved = set()
        for r in running:
            if r.pending == 1:
                self._shape.add(1, r.num_cached)
                self._reserved.add(id(r))
        self._cost = self.model()
        self._now = self.clock()
        self._granted = False
        self.mixed_steps += bool(self._reserved)

    def chunk(self, req, n: int) -> int:
        """The tokens `req` may feed this step, given that the budget allows n (>= 0)."""
        if n <= 0 or id(req) in self._reserved:
            return n
        if req not in self._seen:
            self._seen[req] = self._now  # the start of its TTFT clock on this worker
        start = req.num_cached
        if not self._reserved:  # no decode token in this step: the token budget decides
            self._shape.add(n, start)
            return n
        k = self._largest(n, start)
        if self.config.ttft_target_s is not None and not req.output_ids:
            k = max(k, self._needed(req, n, start, k))
        if not self._granted:
            k = max(k, min(n, self.config.min_chunk))
        if k > 0:
            self._shape.add(k, start)
            self._granted = True
        return k

    def _extra(self, k: int, start: int) -> float:
        """Predicted seconds a chunk of k tokens at `start` adds to the step."""
        c = self._cost.coef
        attention = c[4] * (start + 1) if k == 1 else c[3] * chunk_pairs(k, start)
        return c[1] * k + c[2] + attention

    def _largest(self, n: int, start: int) -> int:
        """The largest k <= n whose chunk keeps the predicted step under the TBT target."""
        slack = self.config.tbt_target_s - self._cost.predict(self._shape)
        if self._extra(1, start) > slack:
            return 0
        lo, hi = 1, n  # the chunk's cost grows with k: bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._extra(mid, start) <= slack:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _needed(self, req, n: int, start: int, k: int) -> int:
        """The smallest chunk >= k that finishes the prompt by its TTFT deadline, if steps stay
        like this one; k when none up to n does."""
        left = self._seen[req] + self.config.ttft_target_s - self._now  # type: ignore[operator]
        remaining = req.pending
        base = self._cost.predict(self._shape)

        def in_time(size: int) -> bool:
            steps = -(-remaining // size)
            return steps * (base + self._extra(size, start)) <= left

        if k >= 1 and in_time(k):
            return k
        if not in_time(n):
            return k
        lo, hi = max(1, k), n
        while lo < hi:
            mid = (lo + hi) // 2
            if in_time(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo
