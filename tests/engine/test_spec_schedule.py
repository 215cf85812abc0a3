"""spec.schedule (DSpark's Algorithm 1): the greedy with its early break against exhaustive
search where the greedy is provably optimal, the early break where it is not (and why it must
stay), non-anticipation, tie-breaking and input checks.

When the greedy is optimal. Let the extensions' values sorted descending be v_1 >= v_2 >= ...
(every survival row is a running product of probabilities, so it never increases and the k
largest values always form a valid set: each row's first few). Then the k-th greedy set is the
best set of k extensions (B = R + k is the same for all of them, and it has the largest tau,
T_k = R + v_1 + ... + v_k). With t_k = 1 / sps(R + k) and d_k = t_{k+1} - t_k, adding the
(k+1)-th improves Theta = T / t exactly when f(k) = v_{k+1} t_k - T_k d_k > 0, and

    f(k+1) - f(k) = (v_{k+2} - v_{k+1}) t_k + v_{k+2} d_k - v_{k+1} d_{k+1} - T_k (d_{k+1} - d_k)

is <= 0 whenever d_k >= 0 and d_{k+1} >= d_k: the step time is non-decreasing and convex in B.
So f never increases: after the first non-improvement none follows, Theta over k is unimodal and
the early break stops at the global optimum. A steps-per-second curve that is merely
non-increasing (the brief's first guess) is not enough: test_the_early_break below is a
counterexample, a step time with a jump.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from deepring.spec.schedule import schedule, throughput
from hypothesis import given, settings
from hypothesis import strategies as st


def brute_force_schedule(survival, sps, max_len) -> tuple[list[int], float]:
    """The lengths with the largest Theta over every combination (small R and G only), and
    that Theta."""
    caps = [max_len] * len(survival) if isinstance(max_len, int) else list(max_len)
    ranges = [range(min(c, len(row)) + 1) for c, row in zip(caps, survival, strict=True)]
    best, best_theta = None, -math.inf
    for lengths in itertools.product(*ranges):
        theta = throughput(survival, list(lengths), sps)
        if theta > best_theta:
            best, best_theta = list(lengths), theta
    return best or [], best_theta


def _convex_sps(base: float, increments: list[float]):
    """1 / t with t(1) = base and t's increments sorted ascending: a non-decreasing, convex step
    time (the increments past the list repeat the last one)."""
    inc = sorted(increments)

    def sps(b: int) -> float:
        t = base + sum(inc[: b - 1]) + max(0, b - 1 - len(inc)) * (inc[-1] if inc else 0.0)
        return 1.0 / t

    return sps


prob = st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False)
survival_rows = st.lists(st.lists(prob, min_size=0, max_size=4), min_size=1, max_size=4).map(
    lambda rows: [list(np.cumprod(r)) for r in rows]  # running products: never increase
)


@settings(max_examples=300, deadline=None)
@given(
    survival=survival_rows,
    base=st.floats(1e-3, 1.0, allow_subnormal=False),
    increments=st.lists(st.floats(0.0, 0.5, allow_subnormal=False), max_size=20),
    max_len=st.integers(0, 4),
)
def test_greedy_is_optimal_for_a_convex_step_time(survival, base, increments, max_len):
    sps = _convex_sps(base, increments)
    got = schedule(survival, sps, max_len)
    _, best = brute_force_schedule(survival, sps, max_len)
    assert throughput(survival, got, sps) >= best * (1 - 1e-12)


@settings(max_examples=300, deadline=None)
@given(
    survival=survival_rows,
    times=st.lists(st.floats(1e-3, 1.0, allow_subnormal=False), min_size=20, max_size=20),
    data=st.data(),
)
def test_never_anticipates(survival, times, data):
    """Whether request r verifies draft k depends on survival[r][:k + 1] and the other rows
    only, for any step-time curve at all: rewriting row r past k (its later values are
    functions of draft k itself) never changes that decision. And the greedy never does worse
    than no drafts."""
    sps = lambda b: 1.0 / times[b - 1]  # noqa: E731 - any curve, not even monotone
    got = schedule(survival, sps, 4)
    assert throughput(survival, got, sps) >= throughput(survival, [0] * len(survival), sps)
    for r, row in enumerate(survival):
        for k in range(len(row)):
            tail = data.draw(st.lists(prob, min_size=len(row) - k - 1, max_size=len(row) - k - 1))
            changed = [list(x) for x in survival]
            changed[r] = row[: k + 1] + [row[k] * f for f in np.cumprod(tail)]
            again = schedule(changed, sps, 4)
            assert (again[r] > k) == (got[r] > k), (r, k)


def test_the_early_break():
    """The scheduler must stop at the first non-improvement even when going on would pay.

    One request, three drafts that each survive with probability 0.9 (a = 0.9, 0.81, 0.729
    would do as well; flat values keep the arithmetic plain), and a step time with a jump:
    1 s for a lone token, 2.5 s for 2 to 4 tokens (a kernel's tile boundary, say). Theta is
    1 / 1 = 1 with no draft, 1.9 / 2.5 = 0.76 with one: the first extension loses, so the
    scheduler verifies nothing. Going on would find 3.7 / 2.5 = 1.48 with all three; but that
    decision to verify draft 1 would rest on a_2 and a_3, which the drafter computes from draft
    1's own token (its confidence head sees the previous token): choosing whether to test a
    draft by looking at it biases which drafts get tested, and the output is no longer the
    target's. With a_2 = a_3 = 0 the same search would verify nothing; it anticipates, and the
    scheduler does not."""
    times = {1: 1.0, 2: 2.5, 3: 2.5, 4: 2.5}
    sps = lambda b: 1.0 / times[b]  # noqa: E731
    a = [[0.9, 0.9, 0.9]]
    assert schedule(a, sps, 3) == [0]
    best, theta = brute_force_schedule(a, sps, 3)
    assert best == [3]
    assert theta == pytest.approx(1.48)
    assert throughput(a, [1], sps) == pytest.approx(0.76)
    # The exhaustive search anticipates: its choice for draft 1 follows the later values.
    assert brute_force_schedule([[0.9, 0.0, 0.0]], sps, 3)[0] == [0]
    assert schedule([[0.9, 0.0, 0.0]], sps, 3) == [0]


def test_picks_the_most_likely_drafts_first():
    # Affine step time: 10 ms + 1 ms per token; a draft pays while a / T > 1 ms / t.
    sps = lambda b: 1.0 / (0.010 + 0.001 * b)  # noqa: E731
    a = [[0.95, 0.9, 0.85, 0.5, 0.1], [0.3, 0.05, 0.0, 0.0, 0.0], [0.99, 0.98, 0.97, 0.96, 0.95]]
    got = schedule(a, sps, 5)
    best, _ = brute_force_schedule(a, sps, 5)
    assert got == best
    assert got[2] == 5
    assert got[1] < got[0] < got[2]


def test_ties_and_caps():
    # Equal values go in row order; an extension that leaves Theta unchanged is not taken.
    times = {2: 1.0, 3: 1.2, 4: 2.0}
    sps = lambda b: 1.0 / times[b]  # noqa: E731
    assert schedule([[0.5], [0.5]], sps, 1) == [1, 0]
    flat = lambda b: 1.0  # noqa: E731
    assert schedule([[0.0, 0.0]], flat, 2) == [0]  # a = 0 adds nothing: not taken
    assert schedule([[1.0, 1.0], [0.5]], flat, 2) == [2, 1]  # free tokens: everything
    # Caps: one for all, one per request, and never past the survival a row has.
    assert schedule([[1.0, 1.0], [1.0]], flat, 1) == [1, 1]
    assert schedule([[1.0, 1.0], [1.0]], flat, [0, 5]) == [0, 1]
    assert schedule(np.array([[0.9, 0.8], [0.7, 0.6]]), flat, np.int64(2)) == [2, 2]


def test_edge_cases_and_checks():
    flat = lambda b: 10.0  # noqa: E731
    assert schedule([], flat, 3) == []
    assert schedule([[], []], flat, 3) == [0, 0]
    assert schedule([[0.9, 0.8]], flat, 0) == [0]
    assert throughput([], [], flat) == 0.0
    for bad in (0.0, float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match=r"sps\(1\) returned"):
            schedule([[0.5]], lambda b, v=bad: v, 1)
    # A curve that goes bad further out is caught when it is reached.
    with pytest.raises(ValueError, match=r"sps\(2\) returned"):
        schedule([[0.5]], lambda b: 1.0 if b == 1 else 0.0, 1)
    with pytest.raises(ValueError, match="survival of request 1"):
        schedule([[0.5], [float("nan")]], flat, 1)
    with pytest.raises(ValueError, match="survival of request 0"):
        schedule([[1.5]], flat, 1)
    with pytest.raises(ValueError, match="max_len must be"):
        schedule([[0.5]], flat, -1)
    with pytest.raises(ValueError, match="max_len values"):
        schedule([[0.5]], flat, [1, 2])
    with pytest.raises(ValueError, match="survival must be"):
        schedule(np.zeros(3), flat, 1)
    with pytest.raises(ValueError, match="outside"):
        throughput([[0.5]], [2], flat)


def test_with_the_packages_own_curve_and_survival():
    """The pieces together: survival from calibrated confidence logits (spec.calibrate), a
    curve from a step-time model (spec.profile: affine in tokens, so the greedy is optimal),
    the scheduler equal to exhaustive search."""
    import torch
    from deepring.cost.model import StepCost
    from deepring.spec.calibrate import apply_temperatures, cumulative
    from deepring.spec.profile import StepsPerSecond

    gen = torch.Generator().manual_seed(0)
    z = torch.randn(4, 5, generator=gen) * 2 + 1.5
    survival = cumulative(apply_temperatures(z, torch.tensor([1.0, 1.2, 1.5, 2.0, 2.5])))
    cost = StepCost.of(base=0.012, token=4e-4, seq=1e-4, pair=0.0, context=1e-7)
    sps = StepsPerSecond.from_step_cost(cost, [1, 8, 32], seqs=4, context=4 * 2048)
    got = schedule(survival.numpy(), sps, 5)
    best, theta = brute_force_schedule(survival.tolist(), sps, 5)
    assert throughput(survival.numpy(), got, sps) == pytest.approx(theta)
    assert got == best
    assert 0 < sum(got) < 20  # neither nothing nor everything: the trade is real here


def _first_pairs(chooser, trials: int, seed: int):
    """The first two tokens after the anchor of `trials` speculative generations of a toy
    target P and drafter Q (Markov chains over 4 tokens), where the drafter's survival depends
    on its own drafts as DSpark's does: a_1 = 0.9, and each later factor is 0.95 after a draft
    of token 0 and 0.05 after any other. chooser(survival row) -> how many drafts to verify.
    Returns the lengths the first step chose and the chi-square p-values of the first token
    and of the pair against the target."""
    import torch
    from deepring.spec.accept import accept_sampled

    p_chain = torch.tensor(
        [
            [0.4, 0.3, 0.2, 0.1],
            [0.25, 0.25, 0.25, 0.25],
            [0.1, 0.2, 0.3, 0.4],
            [0.7, 0.1, 0.1, 0.1],
        ],
        dtype=torch.float64,
    )
    q_chain = torch.tensor(
        [[0.1, 0.5, 0.2, 0.2], [0.6, 0.2, 0.1, 0.1], [0.3, 0.3, 0.3, 0.1], [0.2, 0.2, 0.2, 0.4]],
        dtype=torch.float64,
    )
    gen = torch.Generator().manual_seed(seed)
    g, anchor = 3, 1
    out: list[list[int]] = [[] for _ in range(trials)]
    rows = list(range(trials))
    first_lengths = None
    memo: dict = {}
    while rows:
        prev = torch.tensor([out[r][-1] if out[r] else anchor for r in rows])
        drafts, p, q = [], [], []
        for _ in range(g):
            p.append(p_chain[prev])
            q.append(q_chain[prev])
            prev = torch.multinomial(q_chain[prev], 1, generator=gen).squeeze(1)
            drafts.append(prev)
        p.append(p_chain[prev])
        d = torch.stack(drafts, 1)
        factor = torch.where(d[:, :-1] == 0, 0.95, 0.05).double()
        head = torch.full((len(rows), 1), 0.9, dtype=torch.float64)
        survival = torch.cat([head, factor], 1).cumprod(1)
        lengths = torch.tensor(
            [memo.setdefault(tuple(a), chooser(list(a))) for a in survival.tolist()]
        )
        if first_lengths is None:
            first_lengths = lengths
        n, nxt = accept_sampled(
            d, lengths, torch.stack(q, 1), torch.stack(p, 1),
            torch.rand(len(rows), g, generator=gen, dtype=torch.float64),
            torch.rand(len(rows), generator=gen, dtype=torch.float64),
        )  # fmt: skip
        for i, (r, k, t) in enumerate(zip(rows, n.tolist(), nxt.tolist(), strict=True)):
            out[r].extend([*d[i, :k].tolist(), t])  # emitted: d[:n] + [next]
        rows = [r for r in rows if len(out[r]) < 2]
    pairs = torch.tensor([o[:2] for o in out])
    first = torch.bincount(pairs[:, 0], minlength=4)
    joint = torch.bincount(pairs[:, 0] * 4 + pairs[:, 1], minlength=16)
    want_pair = (p_chain[anchor][:, None] * p_chain).flatten()
    return (
        first_lengths,
        _pvalue(first, trials * p_chain[anchor]),
        _pvalue(joint, trials * want_pair),
    )


def _pvalue(observed, expected) -> float:
    import torch

    stat = ((observed.double() - expected) ** 2 / expected).sum()
    dof = torch.tensor((observed.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))


def test_the_early_break_keeps_sampling_lossless():
    """The end-to-end reason for the early break. With a step time where one draft is a loss
    and three a gain (test_the_early_break's), an exhaustive search verifies draft 1 only when
    the later survival, which follows from draft 1 itself, is high: only when draft 1 is token
    0. Token 0 then comes out more often than the target says: the drafter proposes it with
    probability 0.6, the test passes it with 0.25 / 0.6, and the other 0.4 are plain draws
    that give it 0.25, so 0.25 + 0.4 x 0.25 = 0.35 against the target's 0.25; the chi-square
    test rejects it outright. Algorithm 1 with the same
    inputs, on an affine step time where its lengths do vary with the drafts (1, 2 or 3: whether
    draft 2 is verified follows from draft 1), is exactly the target, first token and pair."""
    times = {1: 1.0, 2: 2.5, 3: 2.5, 4: 2.5}
    jump = lambda b: 1.0 / times[b]  # noqa: E731
    trials = 20_000
    lengths, first, _ = _first_pairs(lambda a: brute_force_schedule([a], jump, 3)[0][0], trials, 1)
    assert set(lengths.tolist()) == {0, 3}
    assert first < 1e-12
    affine = lambda b: 1.0 / (1.0 + 0.5 * (b - 1))  # noqa: E731
    lengths, first, pair = _first_pairs(lambda a: schedule([a], affine, 3)[0], trials, 2)
    assert set(lengths.tolist()) == {1, 2, 3}
    assert first > 1e-4
    assert pair > 1e-4
    # The pair test sees anticipation at the second draft too: verifying draft 2 only when a_3
    # (a function of draft 2) is high biases the second token.
    _, first, pair = _first_pairs(lambda a: 3 if a[2] > 0.5 else 1, trials, 2)
    assert first > 1e-4
    assert pair < 1e-8
