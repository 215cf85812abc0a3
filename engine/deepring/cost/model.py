"""Step time as a linear function of what a step computes, fitted online from measured steps.

A step feeds chunks: a chunk of n tokens of one request, starting at position s (the tokens
before it are in the cache). Its time is modelled as

    t = base + tokens * T + seqs * S + prefill_pairs * P + decode_context * D

- base: what every step pays (weights read once, launches, the scheduler, the sampler's setup);
- tokens (T): what each fed token pays whatever its context (projections, MoE experts, norms);
- seqs (S): what each request in the step pays (its metadata, attention launch, sampling);
- prefill_pairs (P): query-key pairs of the chunks of n >= 2 tokens, n*s + n(n+1)/2: prefill
  attention, compute-bound;
- decode_context (D): keys read by the chunks of one token, s + 1 each: decode attention,
  bound by memory bandwidth, which is why it gets its own coefficient.

V4's attention reads a sliding window plus compressed entries, so its real cost per key is far
below a dense model's, but it still grows linearly with the context: the two attention features
carry that slope (the window's constant part lands in T). The model is linear, so it cannot see
a GPU's roofline (a few hundred prefill tokens riding along a memory-bound decode step for
almost nothing): there it overestimates mixed steps, the safe side for a latency target.

`OnlineFit` fits the coefficients by least squares over the measured steps with a forgetting
factor (old steps fade, so the fit follows a machine that drifts), pulled toward a prior
(`presets.py`) in the directions the steps do not excite (a decode worker never runs long
prefill chunks), clamped to non-negative coefficients, and with outliers (a GC pause, a page
fault storm) down-weighted once it has seen enough steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

FEATURES = ("base", "tokens", "seqs", "prefill_pairs", "decode_context")
N_FEATURES = len(FEATURES)
# Bound on any coefficient off the wire: seconds per unit (1000 s for a step's base is absurd
# already; it only keeps arithmetic finite).
MAX_COEF = 1000.0


def chunk_pairs(n: int, start: int) -> float:
    """Query-key pairs of a causal chunk of n tokens after `start` cached ones."""
    return n * start + n * (n + 1) / 2


@dataclass
class StepShape:
    """The features of one step (or of a part of one, to be added to)."""

    tokens: int = 0
    seqs: int = 0
    pairs: float = 0.0
    context: float = 0.0

    def add(self, n: int, start: int) -> StepShape:
        """Account a chunk of n tokens of a request with `start` tokens cached."""
        self.tokens += n
        self.seqs += 1
        if n == 1:
            self.context += start + 1
        else:
            self.pairs += chunk_pairs(n, start)
        return self

    def plus(self, n: int, start: int) -> StepShape:
        """A copy with one more chunk."""
        return StepShape(self.tokens, self.seqs, self.pairs, self.context).add(n, start)

    def vector(self) -> tuple[float, ...]:
        return (1.0, float(self.tokens), float(self.seqs), self.pairs, self.context)

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int]]) -> StepShape:
        """The shape of a step feeding (n, start) chunks."""
        shape = cls()
        for n, start in chunks:
            shape.add(n, start)
        return shape


@dataclass(frozen=True)
class StepCost:
    """Coefficients in seconds per unit of each feature (FEATURES order), all >= 0."""

    coef: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.coef) != N_FEATURES:
            raise ValueError(f"a step cost has {N_FEATURES} coefficients, got {len(self.coef)}")
        for c in self.coef:
            if not (isinstance(c, (int, float)) and math.isfinite(c) and 0 <= c <= MAX_COEF):
                raise ValueError(f"step cost coefficients must be in [0, {MAX_COEF}], got {c!r}")
        object.__setattr__(self, "coef", tuple(float(c) for c in self.coef))

    @classmethod
    def of(cls, base: float, token: float, seq: float, pair: float, context: float) -> StepCost:
        return cls((base, token, seq, pair, context))

    def predict(self, shape: StepShape) -> float:
        c = self.coef
        return (
            c[0] + c[1] * shape.tokens + c[2] * shape.seqs + c[3] * shape.pairs
            + c[4] * shape.context
        )  # fmt: skip

    def scaled(self, factor: float) -> StepCost:
        """The same shape on a machine `factor` times slower."""
        return StepCost(tuple(min(MAX_COEF, c * factor) for c in self.coef))

    # ---- what the routers ask --------------------------------------------------------------

    def prompt_seconds(self, n: int, start: int, chunk: int) -> float:
        """Worker time to compute tokens [start, start + n) of one prompt in chunks of at most
        `chunk` tokens: its own work, plus its share of each step's base (a step holds about
        `chunk` tokens, whoever they belong to)."""
        if n <= 0:
            return 0.0
        chunk = max(1, chunk)
        c = self.coef
        steps = -(-n // chunk)
        # Pairs of the chunks: each chunk's queries see everything before them.
        pairs, pos, left = 0.0, start, n
        while left > 0:
            k = min(chunk, left)
            pairs += chunk_pairs(k, pos)
            pos += k
            left -= k
        return c[0] * n / chunk + c[1] * n + c[2] * steps + c[3] * pairs

    def decode_step(self, batch: int, context: int) -> float:
        """A decode step of `batch` requests holding `context` tokens between them."""
        if batch <= 0:
            return 0.0
        c = self.coef
        return c[0] + (c[1] + c[2]) * batch + c[4] * (context + batch)

    # ---- wire form (Stats.step_cost) ---------------------------------------------------------

    def to_wire(self) -> list[float]:
        return list(self.coef)

    @classmethod
    def from_wire(cls, value: object) -> StepCost:
        """ValueError unless `value` is a list of N_FEATURES finite numbers in bounds."""
        if not isinstance(value, list) or len(value) != N_FEATURES:
            raise ValueError(f"a step cost is a list of {N_FEATURES} numbers")
        if not all(type(v) in (int, float) for v in value):
            raise ValueError("a step cost holds numbers only")
        return cls(tuple(value))


# What a mid-sized step looks like, per feature: the prior's pull is measured in seconds at
# these magnitudes, so it weighs the same in every feature whatever its unit.
_TYPICAL = np.array([1.0, 256.0, 16.0, 256.0 * 1024.0, 16.0 * 2048.0])


def mean_cost(models: Sequence[StepCost]) -> StepCost:
    """The model whose coefficients are the mean of `models`' (at least one)."""
    if not models:
        raise ValueError("the mean of no step costs")
    # np.mean(axis=0)'s floats, summed in its order (from 0, one model after the other), in
    # plain Python: the cost router asks on every route, and building the array cost more.
    sums = []
    for column in zip(*[m.coef for m in models], strict=True):
        total = 0.0
        for c in column:
            total += c
        sums.append(total / len(models))
    return StepCost(tuple(sums))


# A worker's first steps are left out of its step-time fit (OnlineFit's warmup); until it has
# stepped more than this, its reported model is its prior, not a measurement.
WARMUP_STEPS = 2


class OnlineFit:
    """Exponentially weighted least squares toward a prior. `model` is the current fit."""

    def __init__(
        self,
        prior: StepCost,
        *,
        forget: float = 0.995,
        prior_weight: float = 0.5,
        robust_after: float = 20.0,
        refresh: int = 16,
        warmup: int = 0,
    ) -> None:
        """refresh: the model is solved again after this many steps (a solve costs ~50 us,
        a step on a GPU ~20 ms: fresh enough, and the simulator's millions of steps stay
        cheap). warmup: the first steps are not measured (a process's first steps pay for
        lazy set-up: allocations, kernel compilation; a fit that caught one would predict a
        worker slow, and a router would then send it nothing to correct it with)."""
        if not 0 < forget <= 1:
            raise ValueError("forget must be in (0, 1]")
        if not prior_weight > 0:
            raise ValueError("prior_weight must be > 0")
        self.prior = prior
        self.forget = forget
        self.prior_weight = prior_weight
        self.robust_after = robust_after
        self._xx = np.zeros((N_FEATURES, N_FEATURES))
        self._xy = np.zeros(N_FEATURES)
        self.samples = 0.0  # effective number of steps behind the fit (forgetting applied)
        self.observed = 0  # steps seen
        self.refresh = max(1, refresh)
        self.warmup = max(0, warmup)
        self._model = prior
        self._pending: list[tuple[tuple[float, ...], float, float]] = []  # (x, seconds, weight)

    def observe(self, shape: StepShape, seconds: float) -> None:
        """One measured step."""
        self._add(shape, seconds)
        if len(self._pending) >= self.refresh or 0 < self.observed <= self.refresh:
            self._model = self._solve()  # every step while the fit is young

    def observe_many(self, shapes: Sequence[StepShape], seconds: Sequence[float]) -> None:
        """Several measured steps (solved once at the end when due)."""
        for shape, secs in zip(shapes, seconds, strict=True):
            self._add(shape, secs)
        if len(self._pending) >= self.refresh or 0 < self.observed <= self.refresh:
            self._model = self._solve()

    def _add(self, shape: StepShape, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0) or shape.seqs == 0:
            return
        if self.warmup:
            self.warmup -= 1
            return
        weight = 1.0
        if self.samples >= self.robust_after:
            # Huber-like: a step far off the prediction (a pause: a model that lags a few steps
            # is never this far off) counts as if it were at the threshold.
            pred = self._model.predict(shape)
            limit = 2.0 * pred + 5e-3
            miss = abs(seconds - pred)
            if miss > limit:
                weight = limit / miss
        # Folded into the normal equations at the next solve (one numpy call per batch: a
        # step's own bookkeeping stays a few microseconds).
        self._pending.append((shape.vector(), seconds, weight))
        self.samples = self.samples * self.forget + weight
        self.observed += 1

    @property
    def model(self) -> StepCost:
        return self._model

    def solve(self) -> StepCost:
        """The fit of every step seen so far (model lags by up to `refresh` steps)."""
        if self._pending:
            self._model = self._solve()
        return self._model

    def _fold(self) -> None:
        """Add the pending steps to the normal equations, each forgotten by its age."""
        k = len(self._pending)
        if not k:
            return
        x = np.array([p[0] for p in self._pending])
        y = np.array([p[1] for p in self._pending])
        w = np.array([p[2] for p in self._pending]) * self.forget ** np.arange(k - 1, -1, -1.0)
        decay = self.forget**k
        self._xx = decay * self._xx + (x * w[:, None]).T @ x
        self._xy = decay * self._xy + (x * w[:, None]).T @ y
        self._pending.clear()

    def _solve(self) -> StepCost:
        self._fold()
        # Work in units where a typical step's feature is 1 (feature i divided by t_i, its
        # coefficient multiplied by it): the system is well conditioned whatever the magnitudes
        # (pairs run to 1e9, the base column is 1), a coefficient is the seconds its feature
        # adds to a typical step, and the prior's pull (ridge) weighs every feature alike.
        t = _TYPICAL
        a = self._xx / np.outer(t, t) + self.prior_weight * np.eye(N_FEATURES)
        b = self._xy / t + self.prior_weight * np.array(self.prior.coef) * t
        w = np.linalg.solve(a, b)
        if (w >= 0).all():  # the usual case: no coefficient wants to go negative
            return StepCost(tuple(float(c) for c in np.clip(w / t, 0.0, MAX_COEF)))
        free = list(range(N_FEATURES))
        w = np.zeros(N_FEATURES)
        for _ in range(N_FEATURES):  # active set: drop what goes negative, solve again
            sub = np.linalg.solve(a[np.ix_(free, free)], b[free])
            if (sub >= 0).all():
                w[:] = 0
                w[free] = sub
                break
            free = [f for f, v in zip(free, sub, strict=True) if v >= 0]
            if not free:
                break
        coef = np.clip(w / t, 0.0, MAX_COEF)
        return StepCost(tuple(float(c) for c in coef))


def fit(
    samples: Sequence[tuple[StepShape, float]], prior: StepCost, robust: bool = False
) -> StepCost:
    """A batch fit (no forgetting) of measured (shape, seconds) steps; robust: steps far off
    a first fit are down-weighted in a second (a machine shared with other jobs)."""
    f = OnlineFit(prior, forget=1.0, prior_weight=1e-3, robust_after=math.inf)
    f.observe_many([s for s, _ in samples], [t for _, t in samples])
    first = f.solve()
    if not robust:
        return first
    f = OnlineFit(first, forget=1.0, prior_weight=1e-3, robust_after=0.0)
    f._model = first  # weigh every step against the first fit
    f.observe_many([s for s, _ in samples], [t for _, t in samples])
    return f.solve()
