"""spec.profile: the steps-per-second curve (monotone fit of noisy samples, interpolation,
extrapolation), the curve of a step-time model, and timing a step function on a fake clock."""

from __future__ import annotations

import itertools
import random

import pytest
from deepring.cost.model import StepCost, StepShape
from deepring.spec.profile import MIN_SECONDS, LinearTimes, StepsPerSecond, profile


def test_noisy_samples_become_monotone():
    # An affine machine (10 ms + 0.1 ms per token) measured with +-20% noise, 3 times a size.
    rng = random.Random(0)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    samples = [(b, (0.010 + 1e-4 * b) * rng.uniform(0.8, 1.2)) for b in sizes for _ in range(3)]
    curve = StepsPerSecond(samples)
    assert list(curve.tokens) == sizes
    assert all(a <= b for a, b in itertools.pairwise(curve.seconds))
    rates = [curve(b) for b in range(1, 400)]
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert curve(256) == pytest.approx(1 / 0.0356, rel=0.15)


def test_the_monotone_fit_pools_violators():
    """The least-squares monotone fit, not a running maximum: a fast 2 after a slow 3 pools
    to their mean; a slow outlier does not lift the sizes after it."""
    curve = StepsPerSecond([(1, 1.0), (2, 3.0), (3, 2.0), (4, 4.0)])
    assert curve.seconds == pytest.approx((1.0, 2.5, 2.5, 4.0))
    # Repeated sizes are averaged, and weigh by their count when pooled.
    curve = StepsPerSecond([(1, 2.0), (1, 4.0), (2, 1.0)])
    assert curve.tokens == (1, 2)
    assert curve.seconds == pytest.approx((7 / 3, 7 / 3))


def test_interpolation_and_extrapolation():
    curve = StepsPerSecond([(9, 0.018), (1, 0.010)])
    assert curve.seconds_at(5) == pytest.approx(0.014)  # linear in seconds between samples
    assert curve(5) == pytest.approx(1 / 0.014)
    assert curve.seconds_at(1) == pytest.approx(0.010)
    assert curve.seconds_at(0) == pytest.approx(0.010)  # below: the smallest size's time
    assert curve.seconds_at(17) == pytest.approx(0.026)  # beyond: the last slope carried on
    flat = StepsPerSecond([(8, 0.5)])  # one sample: a flat curve
    assert flat(1) == flat(8) == flat(1000) == 2.0
    several = StepsPerSecond([(1, 1.0), (2, 2.0), (4, 2.0), (8, 6.0)])
    assert [several.seconds_at(b) for b in (1, 1.5, 3, 6, 10)] == pytest.approx(
        [1.0, 1.5, 2.0, 4.0, 8.0]
    )
    assert "StepsPerSecond(1: 1e+03 ms" in repr(several)
    # A tail pooled flat by the monotone fit extrapolates with the mean slope, not for free.
    pooled = StepsPerSecond([(1, 1.0), (5, 3.0), (9, 3.1), (10, 2.9)])
    assert pooled.seconds[-2:] == pytest.approx((3.0, 3.0))
    assert pooled.seconds_at(19) == pytest.approx(3.0 + 2.0 / 9 * 9)


def test_checks():
    with pytest.raises(ValueError, match="at least one sample"):
        StepsPerSecond([])
    for bad in [(0, 1.0), (1.5, 1.0), (True, 1.0)]:
        with pytest.raises(ValueError, match="positive integer"):
            StepsPerSecond([bad])
    for bad in [-1.0, float("nan"), float("inf")]:
        with pytest.raises(ValueError, match="finite and >= 0"):
            StepsPerSecond([(1, bad)])
    with pytest.raises(ValueError, match="tokens must be"):
        StepsPerSecond([(1, 1.0)]).seconds_at(-1)
    # A step measured at zero seconds (a zero-cost model) keeps the rate finite.
    assert StepsPerSecond([(1, 0.0)])(1) == 1 / MIN_SECONDS


def test_from_step_cost():
    cost = StepCost.of(base=0.010, token=0.001, seq=0.0005, pair=1e-7, context=1e-6)
    curve = StepsPerSecond.from_step_cost(cost, [1, 16, 64], seqs=4, context=1000)
    for b in (1, 16, 64):
        want = cost.predict(StepShape(tokens=b, seqs=4, context=1000))
        assert curve.seconds_at(b) == pytest.approx(want)
        assert want == pytest.approx(0.010 + 0.001 * b + 0.002 + 0.001)
    # Affine in tokens, so the interpolation between sizes is exact too.
    assert curve.seconds_at(40) == pytest.approx(0.013 + 0.040)
    assert StepsPerSecond.from_step_cost(StepCost.of(0, 0, 0, 0, 0), [1, 2])(2) == pytest.approx(
        1e9
    )
    with pytest.raises(ValueError, match="at least one size"):
        StepsPerSecond.from_step_cost(cost, [])
    with pytest.raises(ValueError, match="seqs and context"):
        StepsPerSecond.from_step_cost(cost, [1], context=-1.0)


class FakeMachine:
    """A clock that moves only when a step runs: step(B) takes what `times` says (a list per
    size, consumed in order), so the timings are exact and known."""

    def __init__(self, times: dict[int, list[float]]) -> None:
        self.now = 100.0
        self.times = {b: list(ts) for b, ts in times.items()}
        self.calls: list[int] = []

    def clock(self) -> float:
        return self.now

    def step(self, b: int) -> None:
        self.calls.append(b)
        self.now += self.times[b].pop(0)


def test_profile_takes_the_median_after_warmup():
    # The first call of each size (warmup, a compile) is slow and not timed; the median of the
    # three timed ones ignores one outlier.
    m = FakeMachine({1: [9.0, 0.010, 0.500, 0.011], 8: [9.0, 0.020, 0.019, 0.021]})
    curve = profile(m.step, [1, 8], repeats=3, clock=m.clock, budget_s=100.0)
    assert m.calls == [1] * 4 + [8] * 4
    assert curve.seconds == pytest.approx((0.011, 0.020))


def test_profile_is_bounded_in_time():
    """Once the budget is spent, each remaining size gets its warmup and one timed call."""
    m = FakeMachine({b: [1.0] * 10 for b in (1, 2, 4, 8)})
    curve = profile(m.step, [1, 2, 4, 8], repeats=5, clock=m.clock, budget_s=7.5)
    # size 1: warmup + 5 timed (6 s in all); size 2: warmup + 1 timed crosses 7.5 s.
    assert m.calls == [1] * 6 + [2] * 2 + [4] * 2 + [8] * 2
    assert curve.tokens == (1, 2, 4, 8)
    m = FakeMachine({1: [1.0, 2.0]})
    profile(m.step, [1], repeats=3, clock=m.clock, warmup=0, budget_s=0.5)
    assert m.calls == [1]  # never less than one timed call per size
    with pytest.raises(ValueError, match="repeats"):
        profile(m.step, [1], repeats=0)
    with pytest.raises(ValueError, match="at least one size"):
        profile(m.step, [])
    with pytest.raises(ValueError, match="budget_s"):
        profile(m.step, [1], budget_s=0.0)


def test_profile_with_the_real_clock():
    calls = []
    curve = profile(calls.append, [1, 4], repeats=2, warmup=0)
    assert calls == [1, 1, 4, 4]
    assert all(s > 0 for s in curve.seconds)


def _kkt_gap(coef, xs, ts, weights) -> float:
    """How far `coef` is from satisfying the optimality conditions of non-negative least
    squares (an independent certificate, not a second solver): coef >= 0, the gradient of
    the squared residual >= 0, and zero where coef > 0."""
    import numpy as np

    w = np.sqrt(np.asarray(weights, dtype=float))
    a = np.asarray(xs, dtype=float) * w[:, None]
    b = np.asarray(ts, dtype=float) * w
    c = np.asarray(coef)
    grad = a.T @ (a @ c - b)
    scale = float(np.abs(a.T @ b).max()) or 1.0
    return max(float(-c.min()), float(-grad.min()) / scale, float(np.abs(c * grad).max()) / scale)


def test_linear_times_is_the_non_negative_least_squares_fit():
    """Random problems (many with a true coefficient below zero, so the constraint binds):
    the fit satisfies the NNLS optimality conditions over the prior (weighted) and the
    samples, and predict() is its dot product."""
    rng = random.Random(5)
    for _ in range(200):
        width = rng.randint(1, 4)
        true = [rng.uniform(-1.0, 2.0) for _ in range(width)]
        prior = [([rng.uniform(0, 4) for _ in range(width)], rng.uniform(0, 3)) for _ in range(2)]
        fit = LinearTimes(prior, prior_weight=rng.choice([0.5, 8.0]))
        xs, ts = [], []
        for _ in range(rng.randint(0, 40)):
            x = [1.0] + [rng.uniform(0, 32) for _ in range(width - 1)]
            t = max(sum(c * v for c, v in zip(true, x, strict=True)) + rng.gauss(0, 0.3), 0.0)
            fit.add(x, t)
            xs.append(x)
            ts.append(t)
        fit.coef = fit._fit()  # (add() refits every REFIT: check the fit of everything added)
        all_x = [x for x, _ in prior] + xs
        all_t = [t for _, t in prior] + ts
        weights = [fit.prior_weight] * len(prior) + [1.0] * len(xs)
        assert _kkt_gap(fit.coef, all_x, all_t, weights) < 1e-7
        x = [1.0] * width
        assert fit.predict(x) == pytest.approx(max(sum(fit.coef), MIN_SECONDS))


def test_linear_times_learns_the_running_engine_and_keeps_the_prior_elsewhere():
    """A profile 2x off is corrected by measured steps; a coefficient the samples cannot
    tell apart (a steady batch: requests constant) stays where the prior put the split."""
    prior = [((1.0, 1.0, 0.0), 0.020), ((1.0, 4.0, 0.0), 0.026), ((1.0, 4.0, 20.0), 0.046)]
    fit = LinearTimes(prior)
    assert fit.predict((1.0, 32.0, 0.0)) == pytest.approx(0.018 + 0.002 * 32, rel=1e-6)
    rng = random.Random(0)
    for i in range(LinearTimes.KEEP):
        drafts = (i % 5) * 8
        fit.add((1.0, 32.0, drafts), 0.009 + 0.0006 * 32 + 0.0005 * drafts + rng.gauss(0, 1e-4))
    assert fit.predict((1.0, 32.0, 0.0)) == pytest.approx(0.0282, rel=0.03)
    assert fit.predict((1.0, 32.0, 40.0)) == pytest.approx(0.0482, rel=0.03)
    # Only the window counts: KEEP newer samples of a slower machine replace these.
    for _ in range(LinearTimes.KEEP):
        fit.add((1.0, 32.0, 0.0), 0.05)
    assert fit.predict((1.0, 32.0, 0.0)) == pytest.approx(0.05, rel=0.02)


def test_linear_times_scales_one_batch_size_per_request():
    """The drafter's fit (a prior point of 0 s at no request): proposals timed at one batch
    size only predict in proportion to the requests; a second size gives the fixed part."""
    fit = LinearTimes([((1.0, 0.0), 0.0)], prior_weight=1.0)
    assert fit.predict((1.0, 8.0)) == MIN_SECONDS  # nothing measured: free
    fit.add((1.0, 1.0), 0.012)  # the first sample is fitted at once
    assert fit.predict((1.0, 32.0)) == pytest.approx(32 * 0.012, rel=0.05)
    for _ in range(LinearTimes.REFIT):
        fit.add((1.0, 1.0), 0.012)
        fit.add((1.0, 32.0), 0.050)
    # The prior point pulls the fixed part a little towards 0: plain least squares over it
    # and the 33 samples (both coefficients come out positive, so no constraint binds).
    import numpy as np

    xs = [(1.0, 0.0)] + [(1.0, 1.0)] * (LinearTimes.REFIT + 1) + [(1.0, 32.0)] * LinearTimes.REFIT
    ts = [0.0] + [0.012] * (LinearTimes.REFIT + 1) + [0.050] * LinearTimes.REFIT
    want = np.linalg.lstsq(np.array(xs), np.array(ts), rcond=None)[0]
    fit.coef = fit._fit()  # (add() refits every REFIT: fit everything added)
    assert fit.coef == pytest.approx(tuple(want), rel=1e-9)
    assert 0.009 < fit.coef[0] < 0.0108  # the two sizes' line: 0.0108 + 0.00123 per request


def test_linear_times_checks():
    with pytest.raises(ValueError, match="at least one prior"):
        LinearTimes([])
    with pytest.raises(ValueError, match="same number of features"):
        LinearTimes([((1.0,), 1.0), ((1.0, 2.0), 1.0)])
    with pytest.raises(ValueError, match="1 to 8 features"):
        LinearTimes([((1.0,) * 9, 1.0)])
    with pytest.raises(ValueError, match="prior_weight"):
        LinearTimes([((1.0,), 1.0)], prior_weight=0.0)
    fit = LinearTimes([((1.0,), 1.0)])
    with pytest.raises(ValueError, match="2 features, expected 1"):
        fit.add((1.0, 2.0), 1.0)
    fit.add((1.0,), float("nan"))  # a broken clock reading is dropped, not fitted
    fit.add((1.0,), -1.0)
    assert not fit.samples
