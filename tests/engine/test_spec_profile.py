"""spec.profile: the steps-per-second curve (monotone fit of noisy samples, interpolation,
extrapolation), the curve of a step-time model, and timing a step function on a fake clock."""

from __future__ import annotations

import itertools
import random

import pytest
from deepring.cost.model import StepCost, StepShape
from deepring.spec.profile import MIN_SECONDS, StepsPerSecond, profile


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
