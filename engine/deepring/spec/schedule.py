"""How many drafts each request verifies: DSpark's hardware-aware prefix scheduler (Algorithm 1).

Request r's drafter reports a_{r,j}, the (calibrated) probability that its first j drafts all
survive verification (spec.calibrate: the running product of per-position confidences). A step
that verifies l_r drafts of each of R requests feeds B = sum_r (1 + l_r) tokens to the target and
emits tau = sum_r (1 + sum_{j <= l_r} a_{r,j}) tokens in expectation (each request always gets
one token of the target's own, plus each draft that survives). The scheduler picks the lengths
maximising the expected tokens per second Theta = tau * sps(B), with sps the engine's
steps-per-second curve (spec.profile).

Algorithm 1: start from no drafts; take the extensions (r, j) best first (largest a_{r,j}; an
extension is eligible once (r, j - 1) is in, which for survival rows that never increase is the
plain descending order); add each while it strictly improves Theta and stop at the FIRST one that
does not (the early break).

Why the early break, and not a search for the best Theta: it makes the decision to verify draft
j of request r depend only on a_{r,1..j} (and the other requests), never on a_{r,j+1..}. The
drafter's a_{r,j+1} is a function of draft j itself (the confidence head sees the previous
token), so a scheduler that looked further ahead would choose whether to verify a draft by
looking at that draft, and the verified drafts would no longer be distributed as the drafter's
q: speculative sampling would stop being lossless. Under the break, what is looked at before
(r, j) is decided is other requests' extensions and row r's earlier ones: row r's next extension
only becomes a candidate once the one before it is in, and the scan ends at the first loss, so
none of row r's later values is ever read before that decision. tests/engine/test_spec_schedule.py
checks this property and shows a curve where searching on would find a better Theta.

When the greedy is also optimal (proved in the test file, checked against exhaustive search):
for survival rows that never increase (every running product of probabilities), the k-th greedy
set holds the k largest values, so it is the best set of k extensions; Theta over k is unimodal,
so the first non-improvement is the global best, whenever the seconds per step 1 / sps(B) is
non-decreasing and convex in B (a linear step-time model such as cost.model's is). A curve that
is merely non-increasing in steps/s is not enough: a step in the step time (a GPU's tile
quantisation) can make one more draft a loss and four more a gain.

Ties are broken deterministically: equal a_{r,j} go in row order (lower r first), and an
extension that leaves Theta unchanged is not taken (fewer tokens for the same rate).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

import numpy as np


def schedule(
    survival: Sequence[Sequence[float]] | np.ndarray,
    sps: Callable[[int], float],
    max_len: Sequence[int] | int,
) -> list[int]:
    """The number of drafts l_r in [0, min(max_len[r], len(survival[r]))] each request
    verifies (module docstring). survival[r][j] = a_{r,j+1}: the probability that request r's
    first j + 1 drafts all survive (values in [0, 1]; rows may differ in length).
    sps(B): steps per second of a step feeding B tokens (positive and finite, else ValueError).
    max_len: one cap for every request, or one per request."""
    rows = _rows(survival)
    caps = _caps(max_len, rows)
    n = len(rows)
    if n == 0:
        return []
    lengths = [0] * n
    tau, tokens = float(n), n
    theta = tau * _rate(sps, tokens)
    # The frontier: each row's next extension, keyed (-a, r) so the largest a pops first and
    # equal values pop in row order. A row's extension j + 1 only enters once j is in, which is
    # what makes an increasing row (not a running product: a caller's error) still well defined.
    frontier = [(-rows[r][0], r) for r in range(n) if caps[r] > 0]
    heapq.heapify(frontier)
    while frontier:
        neg_a, r = heapq.heappop(frontier)
        cand_tau, cand_tokens = tau - neg_a, tokens + 1
        cand = cand_tau * _rate(sps, cand_tokens)
        if not cand > theta:
            break  # the early break (module docstring): never look past a non-improvement
        tau, tokens, theta = cand_tau, cand_tokens, cand
        lengths[r] += 1
        if lengths[r] < caps[r]:
            heapq.heappush(frontier, (-rows[r][lengths[r]], r))
    return lengths


def throughput(
    survival: Sequence[Sequence[float]] | np.ndarray,
    lengths: Sequence[int],
    sps: Callable[[int], float],
) -> float:
    """Theta = tau * sps(B) of given lengths: the expected tokens per second of the step."""
    rows = _rows(survival)
    if len(lengths) != len(rows):
        raise ValueError(f"{len(lengths)} lengths for {len(rows)} requests")
    for r, k in enumerate(lengths):
        if not 0 <= k <= len(rows[r]):
            raise ValueError(f"length {k} of request {r} is outside [0, {len(rows[r])}]")
    if not rows:
        return 0.0
    tau = sum(1.0 + math.fsum(row[:k]) for row, k in zip(rows, lengths, strict=True))
    return tau * _rate(sps, sum(1 + k for k in lengths))


def _rows(survival: Sequence[Sequence[float]] | np.ndarray) -> list[list[float]]:
    if isinstance(survival, np.ndarray) and survival.ndim != 2:
        raise ValueError(f"survival must be [R, G], got shape {survival.shape}")
    rows = [[float(a) for a in row] for row in survival]
    for r, row in enumerate(rows):
        for a in row:
            # NaN fails both comparisons.
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"survival of request {r} must lie in [0, 1], got {a!r}")
    return rows


def _caps(max_len: Sequence[int] | int, rows: list[list[float]]) -> list[int]:
    if isinstance(max_len, (int, np.integer)):
        limits = [int(max_len)] * len(rows)
    else:
        limits = [int(m) for m in max_len]
        if len(limits) != len(rows):
            raise ValueError(f"{len(limits)} max_len values for {len(rows)} requests")
    if any(m < 0 for m in limits):
        raise ValueError(f"max_len must be >= 0, got {limits}")
    # A request cannot verify drafts it has no survival for.
    return [min(m, len(row)) for m, row in zip(limits, rows, strict=True)]


def _rate(sps: Callable[[int], float], tokens: int) -> float:
    v = float(sps(tokens))
    if not (math.isfinite(v) and v > 0):
        raise ValueError(
            f"sps({tokens}) returned {v!r}: steps per second must be positive and finite"
        )
    return v
