"""The cost-model router (`--router cost`): prefill by predicted completion time, decode by the
dominant share of slots, KV blocks and batch compute.

Prefill. Each prefill worker reports its step-time model (cost.model, fitted on its own steps)
and the predicted seconds of the prompt work it holds. The registry turns that into the
worker's backlog now (the report's backlog less the time since, plus what was sent to it after
the report), and a request's own cost on that worker is its uncached tokens computed after its
cached prefix, in the worker's chunks (attention grows with the context, so a 1,000-token
follow-up on a 30,000-token conversation costs more than a fresh 1,000-token prompt). The
worker that would finish it first wins. Workers that run slower (a busier host, an older
card) report a slower model and get less.

Decode. A decode worker's load is read from both its reports (requests, KV blocks and context
it holds, which include other frontends' requests and blocks held by preempted ones) and the
frontend's own books (which include requests still in prefill, and everything since the last
report): each figure is the larger of the two views plus, for the report, this frontend's
requests it cannot contain yet. The request goes where the largest of its shares after
placement is smallest: slots used, blocks used, and the predicted decode step time against a
reference (the TBT target, or the workers' mean full-batch step), so a slow worker takes fewer
requests and the time between tokens evens out across workers. A worker that can take the
request now (a free slot and blocks for it) beats one that cannot.

Ties rotate, as in the token router.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from deepring.cost.model import StepCost
from deepring.cost.presets import TINY_CPU
from deepring.routing.router import WorkerLoad


def _own(uncached: int | Mapping[str, int], worker: str) -> int:
    return uncached if isinstance(uncached, int) else uncached.get(worker, 0)


class CostRouter:
    def __init__(
        self, block_size: int = 128, fallback: StepCost | None = None,
        tbt_target_s: float | None = None,
    ) -> None:  # fmt: skip
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if tbt_target_s is not None and not tbt_target_s > 0:
            raise ValueError("the TBT target must be > 0")
        self.block_size = block_size
        self.fallback = fallback or TINY_CPU  # for a worker that has not reported yet
        self.tbt_target_s = tbt_target_s
        self._prefill_turn = itertools.count()
        self._decode_turn = itertools.count()

    def model(self, w: WorkerLoad) -> StepCost:
        return w.cost or self.fallback

    def prefill_cost(self, w: WorkerLoad, uncached: int, prompt_tokens: int) -> float:
        """Predicted worker seconds of one prompt: `uncached` tokens after its cached prefix."""
        start = max(0, prompt_tokens - uncached)
        return self.model(w).prompt_seconds(uncached, start, w.chunk)

    def pick_prefill(
        self,
        loads: Iterable[WorkerLoad],
        uncached: int | Mapping[str, int],
        prompt_tokens: int | None = None,
    ) -> WorkerLoad | None:
        """The prefill worker predicted to finish this prompt first."""
        ready = [w for w in loads if w.ready]
        turn = next(self._prefill_turn)
        best, best_key = None, None
        for i, w in enumerate(ready):
            own = _own(uncached, w.worker)
            total = prompt_tokens if prompt_tokens is not None else own
            done_at = w.backlog_s + self.prefill_cost(w, own, total)
            key = (done_at, w.requests, (i - turn) % len(ready))
            if best_key is None or key < best_key:
                best, best_key = w, key
        return best

    def _reference(self, ready: list[WorkerLoad]) -> float:
        """What a decode step time is measured against: the TBT target, else the mean step
        of a full batch (every slot, half the blocks' tokens) over the workers."""
        if self.tbt_target_s is not None:
            return self.tbt_target_s
        steps = [
            self.model(w).decode_step(w.num_slots, w.num_blocks * self.block_size // 2)
            for w in ready
        ]
        return max(1e-9, sum(steps) / len(steps))

    def decode_shares(
        self, w: WorkerLoad, prompt_tokens: int, reference: float
    ) -> tuple[bool, float]:
        """(fits now, the largest share after taking a request of prompt_tokens)."""
        need = -(-(prompt_tokens + 1) // self.block_size)
        requests, tokens, blocks = w.est_requests(), w.est_tokens(), w.est_blocks(self.block_size)
        fits = requests < w.num_slots and blocks + need <= w.num_blocks
        step = self.model(w).decode_step(requests + 1, tokens + prompt_tokens + 1)
        share = max(
            (requests + 1) / max(1, w.num_slots),
            (blocks + need) / max(1, w.num_blocks),
            step / reference,
        )
        return fits, share

    def pick_decode(self, loads: Iterable[WorkerLoad], prompt_tokens: int) -> WorkerLoad | None:
        """The decode worker whose largest share after placement is smallest."""
        ready = [w for w in loads if w.ready]
        if not ready:
            return None
        reference = self._reference(ready)
        turn = next(self._decode_turn)
        best, best_key = None, None
        for i, w in enumerate(ready):
            fits, share = self.decode_shares(w, prompt_tokens, reference)
            key = (not fits, share, (i - turn) % len(ready))
            if best_key is None or key < best_key:
                best, best_key = w, key
        return best
