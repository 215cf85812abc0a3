"""The engine's steps-per-second curve sps(B): how many target steps per second it runs when a
step feeds B tokens. The prefix scheduler (spec.schedule) trades tokens per step against it.

The curve is kept as seconds per step at measured token counts, made non-decreasing (a step
with more tokens never takes less time: a noisy sample that says otherwise is measurement
error) and interpolated linearly in seconds. Linear in seconds rather than in steps/s because
step time is what grows additively with the tokens (cost.model: a fixed part plus a part per
token), so between two samples of an affine machine the interpolation is exact.

Outside the samples: below the smallest size, the smallest size's time (a smaller step is no
slower, and how much faster is unknown: the conservative choice); beyond the largest, the last
segment's slope carried on, or the whole curve's mean slope where that is steeper (step time
keeps growing; a single sample gives a flat curve, so profile at least two sizes).
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from deepring.cost.model import StepCost, StepShape

# A step measured or predicted at zero seconds (a zero-cost model, a coarse clock) counts as a
# nanosecond, so steps/s stays finite (the scheduler refuses an infinite rate).
MIN_SECONDS = 1e-9
MAX_FEATURES = 8  # LinearTimes solves 2^features least-squares problems per fit


class StepsPerSecond:
    """sps(tokens) from measured (batch_tokens, seconds_per_step) samples (module docstring)."""

    def __init__(self, samples: Iterable[tuple[int, float]]) -> None:
        by_size: dict[int, list[float]] = {}
        for tokens, seconds in samples:
            if isinstance(tokens, bool) or int(tokens) != tokens or tokens < 1:
                raise ValueError(f"batch tokens must be a positive integer, got {tokens!r}")
            s = float(seconds)
            if not (math.isfinite(s) and s >= 0):
                raise ValueError(f"seconds per step must be finite and >= 0, got {seconds!r}")
            by_size.setdefault(int(tokens), []).append(max(s, MIN_SECONDS))
        if not by_size:
            raise ValueError("a steps-per-second curve needs at least one sample")
        sizes = sorted(by_size)
        # Repeated sizes: their mean, weighted by their count in the monotone fit.
        means = [statistics.fmean(by_size[k]) for k in sizes]
        weights = [float(len(by_size[k])) for k in sizes]
        self.tokens: tuple[int, ...] = tuple(sizes)
        self.seconds: tuple[float, ...] = tuple(_isotonic(means, weights))

    def seconds_at(self, tokens: float) -> float:
        """Seconds per step at `tokens` (module docstring: interpolation and extrapolation)."""
        if not tokens >= 0:
            raise ValueError(f"tokens must be >= 0, got {tokens!r}")
        xs, ys = self.tokens, self.seconds
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            if len(xs) == 1:
                return ys[0]
            # The last segment's slope, or the curve's mean slope where that is steeper: a
            # tail the monotone fit pooled flat must not make the tokens past it free.
            last = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            mean = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
            return ys[-1] + max(last, mean) * (tokens - xs[-1])
        lo, hi = 0, len(xs) - 1
        while hi - lo > 1:  # the segment [xs[lo], xs[hi]] holding tokens
            mid = (lo + hi) // 2
            if xs[mid] <= tokens:
                lo = mid
            else:
                hi = mid
        w = (tokens - xs[lo]) / (xs[hi] - xs[lo])
        return ys[lo] + w * (ys[hi] - ys[lo])

    def __call__(self, tokens: int) -> float:
        """Steps per second at `tokens` batch tokens: non-increasing in tokens."""
        return 1.0 / self.seconds_at(tokens)

    def __repr__(self) -> str:
        pairs = zip(self.tokens, self.seconds, strict=True)
        pts = ", ".join(f"{k}: {s * 1e3:.3g} ms" for k, s in pairs)
        return f"StepsPerSecond({pts})"

    @classmethod
    def from_step_cost(
        cls, cost: StepCost, sizes: Sequence[int], *, seqs: int = 1, context: float = 0.0
    ) -> StepsPerSecond:
        """The curve a step-time model predicts, without profiling: a step of B tokens is
        `seqs` requests reading `context` keys between them, plus B tokens paying the
        per-token coefficient. Verification chunks are short and read each request's keys
        once, like a decode step, so the extra draft tokens are charged as tokens (not as
        cost.model's prefill pairs); seqs and context are what the step holds whatever the
        lengths, so pass the batch's own for the truest curve."""
        if not sizes:
            raise ValueError("from_step_cost needs at least one size")
        if seqs < 0 or not (math.isfinite(context) and context >= 0):
            raise ValueError(f"seqs and context must be >= 0, got {seqs}, {context}")
        return cls(
            (b, cost.predict(StepShape(tokens=b, seqs=seqs, context=context))) for b in sizes
        )


def profile(
    step_fn: Callable[[int], None],
    sizes: Sequence[int],
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
    *,
    warmup: int = 1,
    budget_s: float = 30.0,
) -> StepsPerSecond:
    """Time step_fn(B) for each B in sizes: `warmup` untimed calls, then the median of up to
    `repeats` timed ones. step_fn must return only when the step is done (synchronise the
    device inside it). budget_s bounds the whole run: once it is spent, each remaining size
    gets its warmup and a single timed call (every size is measured at least once, so a
    budget too small still gives a complete curve, just a noisier one)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    if not sizes:
        raise ValueError("profile needs at least one size")
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s!r}")
    start = clock()
    samples = []
    for b in sizes:
        for _ in range(warmup):
            step_fn(b)
        times = []
        for _ in range(repeats):
            t0 = clock()
            step_fn(b)
            t1 = clock()
            times.append(t1 - t0)
            if t1 - start > budget_s:
                break
        samples.append((b, statistics.median(times)))
    return StepsPerSecond(samples)


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares (pool adjacent
    violators): the noisy samples' best monotone reading, not their running maximum, which
    would let one slow outlier lift every size after it."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out: list[float] = []
    for m, _, c in blocks:
        out.extend([m] * int(c))
    return out


class LinearTimes:
    """Seconds of a step (or of a drafter's proposal) as a linear function of its features
    with non-negative coefficients (seconds = c . x: a fixed part, a part per request, a part
    per draft, ...), fitted by least squares to the last KEEP measured samples and to fixed
    prior samples (a start-up profile) that count `prior_weight` times each.

    Why measured online and not only profiled at start-up: the profile is a few steps of a few
    requests, timed once; on a shared CPU it came out 2x off in both directions between runs
    (a 9 ms step profiled at 17.5 ms), and its per-request part, read at 4 requests, predicted
    72 ms for a 32-request step that took 28-39 (an ad-hoc diagnostic script on tiny-trained,
    2-core dev machine, not a bench). The running engine times every decode step it
    takes, at the batch it actually has; the prior keeps the directions the traffic does not
    vary (a steady batch of 32 says nothing about the fixed part alone) where the profile put
    them."""

    KEEP = 256
    REFIT = 16  # new samples between fits

    def __init__(
        self, prior: Iterable[tuple[Sequence[float], float]], prior_weight: float = 8.0
    ) -> None:
        self.prior = [(tuple(float(v) for v in x), float(t)) for x, t in prior]
        if not self.prior:
            raise ValueError("LinearTimes needs at least one prior sample (its feature count)")
        self.width = len(self.prior[0][0])
        if not 1 <= self.width <= MAX_FEATURES:
            raise ValueError(f"LinearTimes takes 1 to {MAX_FEATURES} features, got {self.width}")
        if any(len(x) != self.width for x, _ in self.prior):
            raise ValueError("prior samples must have the same number of features")
        if not (math.isfinite(prior_weight) and prior_weight > 0):
            raise ValueError(f"prior_weight must be positive, got {prior_weight!r}")
        self.prior_weight = float(prior_weight)
        self.samples: deque[tuple[tuple[float, ...], float]] = deque(maxlen=self.KEEP)
        self._new = 0
        self.coef: tuple[float, ...] = self._fit()

    def add(self, x: Sequence[float], seconds: float) -> None:
        """One measured sample; refits at each of the first REFIT, then every REFIT of them
        (the first measurements matter most: until them only the prior speaks). Non-finite
        times are dropped."""
        if len(x) != self.width:
            raise ValueError(f"{len(x)} features, expected {self.width}")
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        self.samples.append((tuple(float(v) for v in x), float(seconds)))
        self._new += 1
        if self._new >= self.REFIT or len(self.samples) < self.REFIT:
            self._new = 0
            self.coef = self._fit()

    def predict(self, x: Sequence[float]) -> float:
        """The fitted seconds at features x (at least MIN_SECONDS)."""
        return max(math.fsum(c * float(v) for c, v in zip(self.coef, x, strict=True)), MIN_SECONDS)

    def _fit(self) -> tuple[float, ...]:
        rows = [(x, t, self.prior_weight) for x, t in self.prior]
        rows += [(x, t, 1.0) for x, t in self.samples]
        w = np.sqrt(np.array([r[2] for r in rows]))
        a = np.array([r[0] for r in rows]) * w[:, None]
        b = np.array([r[1] for r in rows]) * w
        # Non-negative least squares, exactly: the optimum is the unconstrained fit on some
        # subset of the features with the others at 0, so try every subset whose fit is
        # non-negative and keep the smallest residual (a few features: 2^width small solves).
        # A negative coefficient would be noise saying that a request or a draft saves time.
        best, coef = math.inf, np.zeros(self.width)
        for free in itertools.product((False, True), repeat=self.width):
            cols = [i for i, f in enumerate(free) if f]
            cand = np.zeros(self.width)
            if cols:
                cand[cols] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if (cand < 0).any():
                continue
            res = float(np.sum((a @ cand - b) ** 2))
            # (only a strictly smaller residual replaces the best: among equal ones the first
            # subset tried stays, the empty one before any other)
            if best == math.inf or res < best * (1.0 - 1e-12):
                best, coef = res, cand
        return tuple(float(c) for c in coef)
