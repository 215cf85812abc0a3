"""Calibration of the drafter's confidence head: per-position temperature scaling.

The confidence head gives a logit z_g per draft position g; sigmoid(z_g) is meant to be
c_g = P(draft g accepted | drafts before it accepted), and the running product
a_g = prod_{i<=g} c_i the prefix survival the scheduler (spec.schedule) trades against step
time. A head trained with a BCE loss is usually over- or under-confident, and by an amount that
depends on the position; one temperature T_g per position, c_g = sigmoid(z_g / T_g), fixes most
of it without changing the ranking within a position (ModelConfig.dspark.
confidence_temperatures; model.dspark.DSparkDrafter.survival applies them).

Fitting: T_g minimises the binary negative log-likelihood of the observed acceptances at
position g (the standard temperature scaling of Guo et al. 2017), searched by golden section
over log T within bounds. The likelihood is convex in 1 / T (a one-parameter logistic
regression) and log T is monotone in 1 / T, so it is unimodal in log T and the section search
finds its minimum. (DSpark's paper calibrates the running product instead, one position at a
time by a grid search on the ECE; fitting the per-position factors by likelihood is the smooth
version of the same idea: calibrated factors give a calibrated product when the acceptances are
conditionally independent as the head assumes.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

# Golden-section iterations: each shrinks the log-T interval by 0.618, so 60 take the default
# bounds' width (log 1e4 = 9.2) below 1e-11.
_ITERS = 60
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def fit_temperatures(
    conf_logits: torch.Tensor,
    survived: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    bounds: tuple[float, float] = (1e-2, 1e2),
) -> torch.Tensor:
    """Per-position temperatures T [G] (float32, within `bounds`) minimising the NLL of
    sigmoid(conf_logits[:, g] / T[g]) against survived[:, g].

    survived [N, G]: whether draft g of sample n was accepted. Acceptance at g only has a
    meaning when drafts 0..g-1 were accepted (the head predicts a conditional), so by default
    valid[n, g] = survived[n, :g].all(): the positions up to and including the first
    rejection. Pass `valid` to say otherwise (drafts never verified, padding). A position with
    no valid sample keeps T = 1."""
    if conf_logits.dim() != 2:
        raise ValueError(f"conf_logits must be [N, G], got {list(conf_logits.shape)}")
    if survived.shape != conf_logits.shape:
        raise ValueError(f"survived must be {list(conf_logits.shape)}, got {list(survived.shape)}")
    lo_t, hi_t = bounds
    if not (0 < lo_t <= hi_t and math.isfinite(hi_t)):
        raise ValueError(f"bounds must satisfy 0 < low <= high < inf, got {bounds}")
    z = conf_logits.double()
    if not bool(torch.isfinite(z).all()):
        raise ValueError("conf_logits must be finite")
    y = survived.bool()
    if valid is None:
        valid = _prefix_valid(y)
    elif valid.shape != z.shape:
        raise ValueError(f"valid must be {list(z.shape)}, got {list(valid.shape)}")
    mask = valid.bool().double()
    yd = y.double()
    g = z.shape[1]

    def nll(log_t: torch.Tensor) -> torch.Tensor:  # [G] -> [G]
        s = z / log_t.exp()[None, :]
        # BCE with logits: softplus(s) - y * s, numerically stable for large |s|.
        return ((torch.nn.functional.softplus(s) - yd * s) * mask).sum(0)

    lo = torch.full((g,), math.log(lo_t), dtype=torch.float64, device=z.device)
    hi = torch.full((g,), math.log(hi_t), dtype=torch.float64, device=z.device)
    # Golden section, every position at once: each iteration keeps one interior point and its
    # value, and evaluates one new point per position (one [N, G] evaluation).
    x1 = hi - _PHI * (hi - lo)
    x2 = lo + _PHI * (hi - lo)
    f1, f2 = nll(x1), nll(x2)
    for _ in range(_ITERS):
        left = f1 <= f2  # the minimum is in [lo, x2]: drop (x2, hi]; else drop [lo, x1)
        hi = torch.where(left, x2, hi)
        lo = torch.where(left, lo, x1)
        new = torch.where(left, hi - _PHI * (hi - lo), lo + _PHI * (hi - lo))
        f_new = nll(new)
        # Left: the old x1 becomes x2 and the new point x1; right: the old x2 becomes x1.
        x1, x2 = torch.where(left, new, x2), torch.where(left, x1, new)
        f1, f2 = torch.where(left, f_new, f2), torch.where(left, f1, f_new)
    t = ((lo + hi) / 2).exp().clamp(lo_t, hi_t)
    seen = mask.sum(0) > 0
    return torch.where(seen, t, torch.ones_like(t)).float()


def apply_temperatures(
    conf_logits: torch.Tensor, temps: torch.Tensor | Sequence[float]
) -> torch.Tensor:
    """Calibrated per-position probabilities sigmoid(z / T) over the last axis [..., G];
    temps (a tensor, or a list such as ModelConfig.dspark.confidence_temperatures) may be
    longer than G (a block size larger than the draft: its first G are used)."""
    g = conf_logits.shape[-1]
    t = torch.as_tensor(temps, dtype=torch.float64, device=conf_logits.device).flatten()
    if t.numel() < g:
        raise ValueError(f"{t.numel()} temperatures for {g} positions")
    if not bool((t > 0).all()) or not bool(torch.isfinite(t).all()):
        raise ValueError("temperatures must be positive and finite")
    out = torch.sigmoid(conf_logits.double() / t[:g])
    return out.to(conf_logits.dtype if conf_logits.is_floating_point() else torch.float32)


def cumulative(probs: torch.Tensor) -> torch.Tensor:
    """The prefix survival a_g = prod_{i<=g} c_i over the last axis: the scheduler's input."""
    return probs.cumprod(-1)


def expected_calibration_error(
    probs: torch.Tensor,
    outcomes: torch.Tensor,
    bins: int = 10,
    *,
    valid: torch.Tensor | None = None,
) -> float:
    """ECE: over `bins` equal-width bins of the predicted probability, the sample-weighted mean
    of |mean prediction - observed frequency|. Only entries where `valid` is true count
    (default: all). 0 when there is nothing to measure."""
    if probs.shape != outcomes.shape:
        raise ValueError(f"probs {list(probs.shape)} and outcomes {list(outcomes.shape)} differ")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    p = probs.double().flatten()
    y = outcomes.double().flatten()
    if valid is not None:
        if valid.shape != probs.shape:
            raise ValueError(f"valid must be {list(probs.shape)}, got {list(valid.shape)}")
        keep = valid.bool().flatten()
        p, y = p[keep], y[keep]
    if p.numel() == 0:
        return 0.0
    if not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError("probabilities must lie in [0, 1]")
    # p == 1 belongs to the last bin.
    idx = (p * bins).long().clamp(max=bins - 1)
    sum_p = torch.zeros(bins, dtype=torch.float64).index_add_(0, idx, p)
    sum_y = torch.zeros(bins, dtype=torch.float64).index_add_(0, idx, y)
    # Per bin count * |mean p - mean y| = |sum p - sum y|: no division by empty bins.
    return float((sum_p - sum_y).abs().sum() / p.numel())


def _prefix_valid(survived: torch.Tensor) -> torch.Tensor:
    """valid[n, g] = all(survived[n, :g]): position 0 always, then while drafts survive."""
    ok = survived.long().cumprod(1).bool()
    first = torch.ones_like(ok[:, :1])
    return torch.cat([first, ok[:, :-1]], 1)
