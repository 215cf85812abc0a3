"""The cost-model router (`--router cost`): prefill by predicted completion time, decode by
KV blocks and batch compute relative to the other workers.

Prefill. Each prefill worker reports its step-time model (cost.model, fitted on its own steps)
and the predicted seconds of the prompt work it holds. The registry turns that into the
worker's backlog now (the report's backlog less the time since, plus what was sent to it that
the report could not count), and a request's own cost on that worker is its uncached tokens
computed after its cached prefix, in the worker's chunks (attention grows with the context, so
a 1,000-token follow-up on a 30,000-token conversation costs more than a fresh 1,000-token
prompt). The worker that would finish it first wins. Workers that run slower (a busier host,
an older card) report a slower model and get less.

Decode. A decode worker's load is read from both its reports (requests, KV blocks and context
it holds, which include other frontends' requests and blocks held by preempted ones) and the
frontend's own books (which include requests still in prefill, and everything since the last
report): each figure is the larger of the two views, the report's plus this frontend's
requests it cannot contain yet. Two loads count: its KV blocks, and its predicted decode step
time (its model, its batch: what its requests wait between tokens). The request goes where the
larger of the two, each relative to the workers' mean once the request is placed, is smallest:
that is what keeps max / mean of both low. A slow worker's model predicts longer steps for the
same batch, so it takes fewer requests and the time between tokens evens out. A worker that
can take the request now (a free slot and blocks for it) beats one that cannot; with a TBT
target, one whose predicted step stays under it beats one that would not.

A worker that has not measured its steps yet (its report carries its prior: Stats.steps up to
cost.model.WARMUP_STEPS) is predicted with the mean model of its measured peers: on no evidence
it is assumed to run like them, not as the prior guesses.

Predictions closer than the models can tell apart are ties: completion times within
`TIE_S` (or 2% of the earliest) go to the worker with fewer requests, and a step-time mean below
`TIE_S` counts as `TIE_S` (a microsecond model of a trivial step, as the zero-cost mode fits,
would otherwise weigh its noise like a real load and starve a worker whose fit came out a
little slower: a worker that gets no requests never corrects its model). Remaining ties rotate,
as in the token router.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from deepring.cost.model import StepCost, mean_cost
from deepring.cost.presets import TINY_CPU
from deepring.routing.router import WorkerLoad

TIE_S = 1e-3  # seconds: step-time differences below this are not worth balancing
TIE_FRACTION = 0.02  # of the earliest completion: within the fit's own error


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

    def model(self, w: WorkerLoad, peers: StepCost | None = None) -> StepCost:
        """w's model; one that has measured nothing yet runs like its peers (`peers`, the
        mean of the measured ones), else as the fallback says."""
        return w.cost or peers or self.fallback

    @staticmethod
    def peers(loads: list[WorkerLoad]) -> StepCost | None:
        """The mean model of the measured workers; None when none has measured, or when
        every one has (then `model` never asks: skipping the mean keeps a route over
        hundreds of workers cheap)."""
        measured = [w.cost for w in loads if w.cost is not None]
        return mean_cost(measured) if measured and len(measured) < len(loads) else None

    def prefill_cost(
        self, w: WorkerLoad, uncached: int, prompt_tokens: int, peers: StepCost | None = None
    ) -> float:
        """Predicted worker seconds of one prompt: `uncached` tokens after its cached prefix."""
        start = max(0, prompt_tokens - uncached)
        return self.model(w, peers).prompt_seconds(uncached, start, w.chunk)

    def pick_prefill(
        self,
        loads: Iterable[WorkerLoad],
        uncached: int | Mapping[str, int],
        prompt_tokens: int | None = None,
    ) -> WorkerLoad | None:
        """The prefill worker predicted to finish this prompt first."""
        ready = [w for w in loads if w.ready]
        if not ready:
            return None
        turn = next(self._prefill_turn)
        peers = self.peers(ready)
        done = []
        for w in ready:
            own = _own(uncached, w.worker)
            total = prompt_tokens if prompt_tokens is not None else own
            done.append(w.backlog_s + self.prefill_cost(w, own, total, peers))
        first = min(done)
        tie = first + max(TIE_S, TIE_FRACTION * first)
        best, best_key = None, None
        for i, (w, done_at) in enumerate(zip(ready, done, strict=True)):
            if done_at > tie:
                continue
            key = (w.requests, done_at, (i - turn) % len(ready))
            if best_key is None or key < best_key:
                best, best_key = w, key
        return best

    def _decode_load(
        self, w: WorkerLoad, extra: int, extra_tokens: int, peers: StepCost | None = None
    ) -> tuple[int, float]:
        """(KV blocks, predicted decode step time) of decode worker w with `extra` more
        requests holding `extra_tokens` more tokens."""
        requests, tokens, blocks = w.estimates(self.block_size)
        blocks += extra + extra_tokens // self.block_size
        return blocks, self.model(w, peers).decode_step(requests + extra, tokens + extra_tokens)

    def pick_decode(self, loads: Iterable[WorkerLoad], prompt_tokens: int) -> WorkerLoad | None:
        """The decode worker whose larger relative load after placement (its KV blocks and its
        step time, each over the workers' mean once the request is placed) is smallest; one
        that can take the request now first, and with a TBT target, one that stays under it."""
        ready = [w for w in loads if w.ready]
        if not ready:
            return None
        n = len(ready)
        peers = self.peers(ready)
        # Each worker's load after placement and before it, its estimates read once (this runs
        # over every decode worker for every request), and the terms of the means below.
        bs = self.block_size
        after, kv_terms, step_terms = [], [], []
        grown = 1 + (prompt_tokens + 1) // bs  # the request's blocks
        for w in ready:
            # _decode_load with and without the request, the estimates read once.
            r, t, kv0 = w.estimates(bs)
            model = self.model(w, peers)
            kv = kv0 + grown
            step, step0 = model.decode_step(r + 1, t + prompt_tokens + 1), model.decode_step(r, t)
            after.append((r, kv, step))
            kv_terms.append(kv + (n - 1) * kv0)
            step_terms.append(step + (n - 1) * step0)
        # The means once the request is placed (on average, 1/n of it on each worker).
        kv_mean, step_mean = sum(kv_terms) / n / n, sum(step_terms) / n / n
        kv_mean, step_mean = max(kv_mean, 1e-9), max(step_mean, TIE_S)
        target = self.tbt_target_s
        turn = next(self._decode_turn)
        best, best_key = None, None
        for i, (w, (r, kv, step)) in enumerate(zip(ready, after, strict=True)):
            fits = r < w.num_slots and kv <= w.num_blocks
            over = target is not None and step > target
            key = (not fits, over, max(kv / kv_mean, step / step_mean), (i - turn) % n)
            if best_key is None or key < best_key:
                best, best_key = w, key
        return best
