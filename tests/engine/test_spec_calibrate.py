"""spec.calibrate: per-position temperature scaling recovers the temperature synthetic data
was drawn with, lowers the ECE, and the ECE of calibrated data is small; the prefix-survival
product; input checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from deepring.model.dspark import DSparkDrafter
from deepring.spec.calibrate import (
    apply_temperatures,
    cumulative,
    expected_calibration_error,
    fit_temperatures,
)

TEMPS = [0.5, 1.0, 2.0, 4.0]


def _synthetic(n: int, temps: list[float], seed: int):
    """Logits z ~ N(1, 3^2) per position and outcomes ~ Bernoulli(sigmoid(z / T_g)): a head
    that is over-confident where T > 1 and under-confident where T < 1."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, len(temps), generator=gen) * 3 + 1
    true = torch.sigmoid(z / torch.tensor(temps))
    survived = torch.rand(n, len(temps), generator=gen) < true
    return z, survived, true


@pytest.mark.parametrize("masked", [False, True])
def test_recovers_the_temperature(masked):
    """masked: the default validity (only positions up to the first rejection count, as in
    real verification) leaves fewer samples at later positions but the same answer, since
    the outcomes were drawn independently of the earlier ones."""
    z, survived, _ = _synthetic(40_000, TEMPS, seed=0)
    valid = None if masked else torch.ones_like(survived)
    got = fit_temperatures(z, survived, valid)
    assert got.shape == (4,)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(TEMPS), rtol=0.1, atol=0.0)


def test_the_fit_is_the_likelihoods_minimum():
    """No temperature on a fine grid has a lower NLL than the section search's (its float32
    rounding aside)."""
    z, survived, _ = _synthetic(2_000, TEMPS, seed=5)
    temps = fit_temperatures(z, survived, torch.ones_like(survived)).double()
    grid = torch.exp(torch.linspace(-4.6, 4.6, 4_001, dtype=torch.float64))
    for g in range(len(TEMPS)):
        zg, yg = z[:, g].double(), survived[:, g].double()

        def nll(t, zg=zg, yg=yg):
            s = zg[None, :] / t[:, None]
            return (torch.nn.functional.softplus(s) - yg[None, :] * s).sum(1)

        assert nll(temps[g : g + 1]).item() <= nll(grid).min().item() + 1e-6 * len(zg)


def test_calibration_lowers_the_ece():
    z, survived, _ = _synthetic(20_000, TEMPS, seed=1)
    valid = torch.ones_like(survived)
    raw = expected_calibration_error(torch.sigmoid(z), survived)
    temps = fit_temperatures(z, survived, valid)
    # Measured on fresh data drawn the same way, so the fit's own noise is not rewarded.
    z2, survived2, _ = _synthetic(20_000, TEMPS, seed=2)
    calibrated = expected_calibration_error(apply_temperatures(z2, temps), survived2)
    # Pooled over positions the over- and under-confident ones partly cancel: 0.057 here.
    assert raw > 0.04
    assert calibrated < 0.01
    # Per position: 0.07 -> 0.005 (T 0.5), 0.10 -> 0.011 (T 2), 0.20 -> 0.004 (T 4); the
    # already calibrated position (T 1) stays small.
    after = apply_temperatures(z2, temps)
    for g, t in enumerate(TEMPS):
        before_g = expected_calibration_error(torch.sigmoid(z2[:, g]), survived2[:, g])
        after_g = expected_calibration_error(after[:, g], survived2[:, g])
        if t == 1.0:
            assert after_g < 0.015
        else:
            assert after_g < before_g / 5


def test_the_ece_of_calibrated_data_is_small():
    gen = torch.Generator().manual_seed(3)
    p = torch.rand(50_000, generator=gen)
    y = torch.rand(50_000, generator=gen) < p
    assert expected_calibration_error(p, y) < 0.01
    # And of a constant 0.5 against outcomes that are always true: 0.5 exactly.
    assert expected_calibration_error(torch.full((10,), 0.5), torch.ones(10)) == 0.5


def test_ece_by_hand():
    p = torch.tensor([0.1, 0.9, 1.0, 0.0])
    y = torch.tensor([0, 1, 1, 1])
    # bins: 0.1 -> bin 1 |0.1 - 0|; 0.9 and 1.0 -> bin 9 |1.9 - 2|; 0.0 -> bin 0 |0 - 1|.
    assert expected_calibration_error(p, y) == pytest.approx((0.1 + 0.1 + 1.0) / 4)
    assert expected_calibration_error(p, y, bins=1) == pytest.approx(abs(2.0 - 3.0) / 4)
    valid = torch.tensor([True, True, True, False])
    assert expected_calibration_error(p, y, valid=valid) == pytest.approx(0.2 / 3)
    assert expected_calibration_error(p[:0], y[:0]) == 0.0


def test_survival_is_the_running_product():
    z = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    temps = torch.tensor([2.0, 1.0, 0.5, 7.0])  # longer than G: the first G are used
    c = apply_temperatures(z, temps)
    want = torch.sigmoid(z / temps[:3])
    torch.testing.assert_close(c, want)
    torch.testing.assert_close(apply_temperatures(z, temps.tolist()), want)  # a config's list
    torch.testing.assert_close(cumulative(c), torch.stack([want[:, 0], want[:, 0] * want[:, 1],
                                                            want.prod(1)], 1))  # fmt: skip
    # The drafter's own survival (model.dspark, temperatures from its config) agrees.
    drafter = SimpleNamespace(ds=SimpleNamespace(confidence_temperatures=temps.tolist()))
    torch.testing.assert_close(DSparkDrafter.survival(drafter, z), cumulative(c))
    assert apply_temperatures(z.double(), temps).dtype == torch.float64


def test_default_validity_and_degenerate_positions():
    # Outcomes past the first rejection carry no information under the default validity: a
    # row rejected at 0 says nothing about positions 1 and 2, so garbage there changes nothing.
    z, survived, _ = _synthetic(5_000, [1.0, 2.0, 3.0], seed=4)
    first_rejected = ~survived[:, 0]
    scrambled = survived.clone()
    scrambled[first_rejected, 1:] = ~scrambled[first_rejected, 1:]
    torch.testing.assert_close(fit_temperatures(z, survived), fit_temperatures(z, scrambled))
    # A position nobody reached keeps T = 1; a position always right goes to the bound that
    # makes it most confident; temperatures stay within the bounds.
    z = torch.tensor([[3.0, 1.0], [2.0, 1.0]])
    never = torch.tensor([[False, False], [False, False]])
    assert fit_temperatures(z, never)[1].item() == 1.0
    always = torch.tensor([[True, True], [True, True]])
    temps = fit_temperatures(z, always, bounds=(0.1, 10.0))
    assert temps.tolist() == pytest.approx([0.1, 0.1], rel=1e-6)


def test_checks():
    z = torch.zeros(4, 3)
    s = torch.zeros(4, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="conf_logits must be"):
        fit_temperatures(z[0], s[0])
    with pytest.raises(ValueError, match="survived must be"):
        fit_temperatures(z, s[:, :2])
    with pytest.raises(ValueError, match="valid must be"):
        fit_temperatures(z, s, s[:2])
    with pytest.raises(ValueError, match="bounds"):
        fit_temperatures(z, s, bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="finite"):
        fit_temperatures(z.fill_(float("nan")), s)
    with pytest.raises(ValueError, match="temperatures for"):
        apply_temperatures(torch.zeros(2, 3), torch.ones(2))
    with pytest.raises(ValueError, match="positive and finite"):
        apply_temperatures(torch.zeros(2, 3), torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="differ"):
        expected_calibration_error(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="bins"):
        expected_calibration_error(torch.zeros(3), torch.zeros(3), bins=0)
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        expected_calibration_error(torch.tensor([1.5]), torch.zeros(1))
