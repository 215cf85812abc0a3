"""The step-time model (cost.model): features, the online fit, the wire form; and the chunk
pacer (cost.pacer) on hand-built steps."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from deepring.cost.model import OnlineFit, StepCost, StepShape, chunk_pairs, fit, mean_cost
from deepring.cost.pacer import Pacer, PacerConfig
from deepring.cost.presets import H800_GPU, TINY_CPU

TRUE = StepCost.of(base=8e-3, token=1.2e-4, seq=6e-4, pair=4e-8, context=3e-7)


def _random_shape(rng: random.Random) -> StepShape:
    shape = StepShape()
    for _ in range(rng.randint(0, 24)):  # decode tokens
        shape.add(1, rng.randint(10, 3000))
    for _ in range(rng.randint(0, 2)):  # prefill chunks
        shape.add(rng.randint(2, 512), rng.choice((0, 512, 2048)))
    if shape.seqs == 0:
        shape.add(1, 100)
    return shape


def test_features_of_a_step():
    shape = StepShape.of([(1, 99), (1, 9), (100, 50)])
    assert (shape.tokens, shape.seqs) == (102, 3)
    assert shape.context == 100 + 10
    assert shape.pairs == chunk_pairs(100, 50) == 100 * 50 + 100 * 101 / 2
    assert TRUE.predict(shape) == pytest.approx(
        8e-3 + 102 * 1.2e-4 + 3 * 6e-4 + shape.pairs * 4e-8 + 110 * 3e-7
    )


def test_the_fit_recovers_the_coefficients():
    rng = random.Random(1)
    f = OnlineFit(TINY_CPU, forget=1.0)
    for _ in range(300):
        shape = _random_shape(rng)
        f.observe(shape, TRUE.predict(shape))
    # Requests and decode context move together in decode steps, so the prior's pull leaves
    # a bias between those two; the others are pinned down, and the predictions are what count.
    got = f.solve().coef
    for i in (0, 1, 3):
        assert got[i] == pytest.approx(TRUE.coef[i], rel=0.05)
    for _ in range(50):
        shape = _random_shape(rng)
        assert f.solve().predict(shape) == pytest.approx(TRUE.predict(shape), rel=0.03)


def test_the_fit_follows_a_machine_that_slows_down():
    rng = random.Random(2)
    f = OnlineFit(TINY_CPU, forget=0.98)
    for _ in range(200):
        shape = _random_shape(rng)
        f.observe(shape, TRUE.predict(shape))
    slow = TRUE.scaled(1.3)
    for _ in range(300):
        shape = _random_shape(rng)
        f.observe(shape, slow.predict(shape))
    probe = StepShape.of([(1, 1000)] * 16 + [(256, 512)])
    assert f.solve().predict(probe) == pytest.approx(slow.predict(probe), rel=0.03)


def test_outliers_barely_move_the_fit():
    rng = random.Random(3)
    f = OnlineFit(TINY_CPU, forget=0.995)
    for i in range(400):
        shape = _random_shape(rng)
        seconds = TRUE.predict(shape)
        if i % 50 == 49:
            seconds += 2.0  # a pause of two seconds
        f.observe(shape, seconds)
    probe = StepShape.of([(1, 1000)] * 16)
    assert f.solve().predict(probe) == pytest.approx(TRUE.predict(probe), rel=0.1)


def test_unexcited_features_keep_the_prior():
    """A decode worker never runs prefill chunks: the pair coefficient stays the prior's."""
    rng = random.Random(4)
    f = OnlineFit(TINY_CPU)
    for _ in range(200):
        shape = StepShape.of((1, rng.randint(10, 3000)) for _ in range(rng.randint(1, 32)))
        f.observe(shape, TRUE.predict(shape))
    assert f.solve().coef[3] == pytest.approx(TINY_CPU.coef[3], rel=0.05)
    assert all(c >= 0 for c in f.solve().coef)


def test_a_batch_fit_and_bad_samples():
    rng = random.Random(5)
    samples = [(s, TRUE.predict(s)) for s in (_random_shape(rng) for _ in range(100))]
    samples.append((StepShape(), 1.0))  # an empty step is ignored
    samples.append((StepShape.of([(1, 5)]), math.nan))  # so is a broken measurement
    model = fit(samples, H800_GPU)
    assert model.coef[0] == pytest.approx(TRUE.coef[0], rel=0.02)


def test_the_wire_form_is_checked():
    assert StepCost.from_wire(TRUE.to_wire()) == TRUE
    for bad in (
        [1.0] * 4,
        "0.1",
        [0.1, -1e-4, 0, 0, 0],
        [0.1, math.inf, 0, 0, 0],
        [0.1, math.nan, 0, 0, 0],
        [0.1, True, 0, 0, 0],
        [0.1, "1", 0, 0, 0],
        [1e9, 0, 0, 0, 0],
    ):
        with pytest.raises(ValueError, match="step cost"):
            StepCost.from_wire(bad)


def test_router_helpers():
    m = StepCost.of(base=0.01, token=1e-4, seq=1e-3, pair=1e-8, context=1e-7)
    # 1,000 tokens after 3,000 cached, in chunks of 400: 3 chunks.
    pairs = chunk_pairs(400, 3000) + chunk_pairs(400, 3400) + chunk_pairs(200, 3800)
    want = 0.01 * 1000 / 400 + 1e-4 * 1000 + 3e-3 + 1e-8 * pairs
    assert m.prompt_seconds(1000, 3000, 400) == pytest.approx(want)
    assert m.prompt_seconds(0, 5, 400) == 0
    shape = StepShape.of([(1, 99)] * 8)
    assert m.decode_step(8, 8 * 99) == pytest.approx(m.predict(shape))


# ---- the pacer ---------------------------------------------------------------------------------


class _Req:
    """What the pacer reads of a request (core.request.Request)."""

    def __init__(self, num_cached: int, pending: int, output: int) -> None:
        self.num_cached, self.pending, self.output_ids = num_cached, pending, [0] * output


def _req(num_cached: int, pending: int, output: int = 0) -> _Req:
    return _Req(num_cached, pending, output)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_mixed_step_stays_under_the_target():
    target = 0.05
    pacer = Pacer(PacerConfig(tbt_target_s=target), lambda: TRUE)
    decodes = [_req(1000 + i, 1, output=5) for i in range(20)]
    long = _req(0, 5000)
    pacer.begin([*decodes, long])
    for d in decodes:
        assert pacer.chunk(d, 1) == 1
    k = pacer.chunk(long, 2048)
    shape = StepShape.of([(1, d.num_cached) for d in decodes] + [(k, 0)])
    assert TRUE.predict(shape) <= target
    over = StepShape.of([(1, d.num_cached) for d in decodes] + [(k + 1, 0)])
    assert TRUE.predict(over) > target  # the largest that fits
    # Nothing is left for a second prompt in this step.
    assert pacer.chunk(_req(0, 300), 2048 - k) == 0


def test_prefill_only_steps_keep_the_token_budget():
    pacer = Pacer(PacerConfig(tbt_target_s=0.001), lambda: TRUE)
    long = _req(0, 5000)
    pacer.begin([long])
    assert pacer.chunk(long, 2048) == 2048
    assert pacer.mixed_steps == 0


def test_a_prompt_never_starves_behind_a_big_batch():
    pacer = Pacer(PacerConfig(tbt_target_s=0.01, min_chunk=24), lambda: TRUE)
    decodes = [_req(3000, 1, output=3) for _ in range(64)]  # alone far over 10 ms
    pacer.begin(decodes)
    assert pacer.chunk(_req(0, 1000), 2048) == 24
    assert pacer.chunk(_req(0, 1000), 2048) == 0  # the guarantee is one chunk per step


def test_a_ttft_deadline_buys_a_larger_chunk():
    clock = _Clock()
    cfg = PacerConfig(tbt_target_s=0.03, ttft_target_s=3.0)
    pacer = Pacer(cfg, lambda: TRUE, clock)
    decodes = [_req(1000, 1, output=3) for _ in range(16)]
    prompt = _req(0, 6000)
    pacer.begin([*decodes, prompt])
    paced = Pacer(PacerConfig(tbt_target_s=0.03), lambda: TRUE)
    paced.begin([*decodes, prompt])
    k_tbt = paced.chunk(prompt, 4096)
    k = pacer.chunk(prompt, 4096)
    assert k > k_tbt
    steps = -(-6000 // k)
    step = TRUE.predict(StepShape.of([(1, 1000)] * 16 + [(k, 0)]))
    assert steps * step <= 3.0
    # Hopeless (the deadline passed): back to the TBT-bound chunk.
    clock.now = 5.0
    pacer.begin([*decodes, prompt])
    assert pacer.chunk(prompt, 4096) == k_tbt


def test_pacer_config_is_checked():
    for kw in ({"tbt_target_s": 0}, {"tbt_target_s": 0.1, "ttft_target_s": -1},
               {"tbt_target_s": 0.1, "min_chunk": 0}):  # fmt: skip
        with pytest.raises(ValueError, match="must be"):
            PacerConfig(**kw)


def test_mean_cost_is_numpys_mean_float_for_float():
    """mean_cost sums in plain Python (the cost router asks on every route): the same floats,
    signed zeros included, as numpy's mean over the models."""
    rng = random.Random(3)
    for _ in range(2000):
        n = rng.choice([1, 2, 3, 8, 9, 17, 64, 200])
        models = [
            StepCost(tuple(rng.choice([0.0, -0.0, rng.random() * 10 ** rng.randint(-9, 0)])
                           for _ in range(5)))
            for _ in range(n)
        ]  # fmt: skip
        want = [float(c) for c in np.mean([m.coef for m in models], axis=0)]
        got = mean_cost(models).coef
        assert [repr(c) for c in got] == [repr(c) for c in want]
    with pytest.raises(ValueError, match="no step costs"):
        mean_cost([])
