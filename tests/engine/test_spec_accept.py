"""spec.accept: greedy verification against a plain loop, speculative sampling's output
distribution against the target's (chi-square over many seeded draws), the (seed, position)
randomness and its two streams, degenerate rows and input checks."""

from __future__ import annotations

import math

import pytest
import torch
from deepring.kernels.sampling import sample_torch
from deepring.sampling.sampler import uniform
from deepring.spec.accept import accept_greedy, accept_sampled, step_uniforms, uniforms
from hypothesis import given, settings
from hypothesis import strategies as st

# ---- greedy ----------------------------------------------------------------------------------


def _greedy_loop(draft, lengths, target):
    out = []
    for d, n_max, t in zip(draft, lengths, target, strict=True):
        n = 0
        while n < n_max and d[n] == t[n]:
            n += 1
        out.append((n, t[n]))
    return out


@settings(max_examples=200, deadline=None)
@given(data=st.data(), r=st.integers(0, 6), g=st.integers(0, 5))
def test_greedy_matches_a_plain_loop(data, r, g):
    # A 3-token vocabulary makes matches, mismatches and full acceptance all common.
    tok = st.integers(0, 2)
    draft = data.draw(st.lists(st.lists(tok, min_size=g, max_size=g), min_size=r, max_size=r))
    target = data.draw(
        st.lists(st.lists(tok, min_size=g + 1, max_size=g + 1), min_size=r, max_size=r)
    )
    lengths = data.draw(st.lists(st.integers(0, g), min_size=r, max_size=r))
    n, nxt = accept_greedy(
        torch.tensor(draft, dtype=torch.long).reshape(r, g),
        torch.tensor(lengths, dtype=torch.long),
        torch.tensor(target, dtype=torch.long).reshape(r, g + 1),
    )
    assert list(zip(n.tolist(), nxt.tolist(), strict=True)) == _greedy_loop(draft, lengths, target)


def test_greedy_checks_its_input():
    d, t = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="lengths must lie in"):
        accept_greedy(d, torch.tensor([0, 4]), t)
    with pytest.raises(ValueError, match="target_ids must be"):
        accept_greedy(d, torch.tensor([0, 1]), t[:, :3])
    with pytest.raises(ValueError, match="lengths must be"):
        accept_greedy(d, torch.tensor([0]), t)


# ---- sampled: the output distribution is the target's -----------------------------------------

V = 6
# A toy target and drafter: Markov chains over 6 tokens, P[prev] the target's next-token
# distribution, Q[prev] the drafter's. Both have zeros, in different places: the drafter
# proposes tokens the target never emits, and misses tokens the target does.
P = torch.tensor(
    [
        [0.30, 0.25, 0.00, 0.20, 0.15, 0.10],
        [0.05, 0.00, 0.50, 0.25, 0.20, 0.00],
        [0.40, 0.10, 0.10, 0.00, 0.00, 0.40],
        [0.00, 0.30, 0.30, 0.20, 0.10, 0.10],
        [0.25, 0.25, 0.25, 0.00, 0.25, 0.00],
        [0.10, 0.20, 0.30, 0.40, 0.00, 0.00],
    ],
    dtype=torch.float64,
)
Q = torch.tensor(
    [
        [0.10, 0.40, 0.30, 0.00, 0.20, 0.00],
        [0.20, 0.20, 0.20, 0.20, 0.00, 0.20],
        [0.00, 0.00, 0.90, 0.05, 0.00, 0.05],
        [0.50, 0.10, 0.00, 0.30, 0.10, 0.00],
        [0.25, 0.25, 0.25, 0.00, 0.25, 0.00],  # equal to P's row: every draft accepted
        [0.00, 0.50, 0.00, 0.00, 0.50, 0.00],
    ],
    dtype=torch.float64,
)
# Deterministic drafts (q None): a fixed guess per previous token, some of them impossible.
GUESS = torch.tensor([2, 2, 0, 0, 3, 3])
ANCHOR = 0
G = 3


def _speculate(q_mode: str, trials: int, seed: int, dtype=torch.float32) -> list[list[int]]:
    """The first two tokens after ANCHOR of `trials` independent generations by speculative
    decoding with the toy chains: each step drafts G tokens (sampled from Q, or GUESS with
    q None), verifies a random number of them (0..G: the lengths must not matter), emits."""
    gen = torch.Generator().manual_seed(seed)
    out: list[list[int]] = [[] for _ in range(trials)]
    prev = torch.full((trials,), ANCHOR, dtype=torch.long)
    rows = torch.arange(trials)
    while rows.numel():
        r = rows.numel()
        drafts, p, q = [], [], []
        last = prev[rows]
        for _ in range(G):
            p.append(P[last])
            if q_mode == "none":
                d = GUESS[last]
            else:
                q.append(Q[last])
                d = torch.multinomial(Q[last], 1, generator=gen).squeeze(1)
            drafts.append(d)
            last = d
        p.append(P[last])
        lengths = torch.randint(0, G + 1, (r,), generator=gen)
        n, nxt = accept_sampled(
            torch.stack(drafts, 1),
            lengths,
            None if q_mode == "none" else torch.stack(q, 1).to(dtype),
            torch.stack(p, 1).to(dtype),
            torch.rand(r, G, generator=gen, dtype=torch.float64),
            torch.rand(r, generator=gen, dtype=torch.float64),
        )
        d_all = torch.stack(drafts, 1).tolist()
        keep = []
        for i, (row, k, t) in enumerate(zip(rows.tolist(), n.tolist(), nxt.tolist(), strict=True)):
            out[row].extend([*d_all[i][:k], t])
            prev[row] = out[row][-1]
            if len(out[row]) < 2:
                keep.append(row)
        rows = torch.tensor(keep, dtype=torch.long)
    return [o[:2] for o in out]


def _chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test over the cells the target can produce; a sample in a cell the target
    gives probability 0 fails outright (that is not a matter of chance)."""
    impossible = expected == 0
    assert observed[impossible].sum() == 0, "drew a token the target never emits"
    o, e = observed[~impossible].double(), expected[~impossible].double()
    stat = ((o - e) ** 2 / e).sum()
    dof = o.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0))


@pytest.mark.parametrize("q_mode", ["sampled", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sampled_output_is_distributed_as_the_target(q_mode, dtype):
    trials = 30_000
    pairs = torch.tensor(_speculate(q_mode, trials, seed=11, dtype=dtype))
    first = torch.bincount(pairs[:, 0], minlength=V)
    assert _chi2_pvalue(first, trials * P[ANCHOR]) > 1e-4
    joint = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V)
    want = (P[ANCHOR][:, None] * P).flatten() * trials
    assert _chi2_pvalue(joint, want) > 1e-4


def test_the_chi_square_check_has_power():
    """At this sample size the check passes plain sampling from the target and rejects a
    distribution 2 points off it (0.02 of the mass moved between two tokens): passing the
    test above means something."""
    trials = 30_000
    gen = torch.Generator().manual_seed(3)
    right = torch.multinomial(P[ANCHOR], trials, replacement=True, generator=gen)
    assert _chi2_pvalue(torch.bincount(right, minlength=V), trials * P[ANCHOR]) > 1e-4
    off = P[ANCHOR].clone()
    off[0] -= 0.02
    off[1] += 0.02
    wrong = torch.multinomial(off, trials, replacement=True, generator=gen)
    assert _chi2_pvalue(torch.bincount(wrong, minlength=V), trials * P[ANCHOR]) < 1e-4


# ---- sampled: determinism, the plain sampler's draw, degenerate rows -------------------------


def _batch(r: int, g: int, v: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(r, g, v, generator=gen) * 2, -1)
    p = torch.softmax(torch.randn(r, g + 1, v, generator=gen) * 2, -1)
    draft = torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(r, g)
    lengths = torch.randint(0, g + 1, (r,), generator=gen)
    return draft, lengths, q, p


def test_sampled_is_a_function_of_the_seeds_and_positions():
    draft, lengths, q, p = _batch(8, 4, 50, seed=1)
    u_acc, u_res = step_uniforms(list(range(100, 108)), [5 * i for i in range(8)], 4)
    a = accept_sampled(draft, lengths, q, p, u_acc, u_res)
    b = accept_sampled(draft, lengths, q, p, u_acc.clone(), u_res.clone())
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # A row alone gives what it gives in the batch (the rows do not interact).
    for i in range(8):
        one = accept_sampled(
            draft[i : i + 1], lengths[i : i + 1], q[i : i + 1], p[i : i + 1],
            u_acc[i : i + 1], u_res[i : i + 1],
        )  # fmt: skip
        assert (one[0].item(), one[1].item()) == (a[0][i].item(), a[1][i].item())
    # Half-precision distributions are taken as they are (normalisers summed in float32).
    n, nxt = accept_sampled(draft, lengths, q.bfloat16(), p.bfloat16(), u_acc, u_res)
    assert (n <= lengths).all()
    assert ((nxt >= 0) & (nxt < 50)).all()


@pytest.mark.gpu
def test_sampled_on_the_device_equals_the_host():
    """The same verification on CUDA (p and q there, the uniforms and lengths from the host,
    as step_uniforms builds them) gives the host's tokens."""
    draft, lengths, q, p = _batch(64, 5, 1000, seed=6)
    u_acc, u_res = step_uniforms(list(range(64)), [3 * i for i in range(64)], 5)
    for qq in (q, None):
        want = accept_sampled(draft, lengths, qq, p, u_acc, u_res)
        got = accept_sampled(
            draft.cuda(), lengths, None if qq is None else qq.cuda(), p.cuda(), u_acc, u_res
        )
        assert [g.tolist() for g in got] == [w.tolist() for w in want]


def test_uniform_streams():
    # resample is the plain sampler's own number; accept is another stream.
    assert uniforms(7, 100, 3, stream="resample") == [uniform(7, t) for t in (100, 101, 102)]
    acc = uniforms(7, 100, 300)
    res = uniforms(7, 100, 300, stream="resample")
    assert not set(acc) & set(res)
    assert all(0.0 <= u < 1.0 for u in acc)
    assert abs(sum(acc) / len(acc) - 0.5) < 0.05
    # The vectorized helper agrees with the scalar one, row by row.
    u_acc, u_res = step_uniforms([7, 2**64 - 1, 0], [100, 0, 2**40], 3)
    for i, (s, t) in enumerate([(7, 100), (2**64 - 1, 0), (0, 2**40)]):
        assert u_acc[i].tolist() == uniforms(s, t, 3)
        assert u_res[i].tolist() == uniforms(s, t, 4, stream="resample")
    with pytest.raises(ValueError, match="stream"):
        uniforms(7, 0, 1, stream="bonus")
    with pytest.raises(ValueError, match="positions"):
        uniforms(7, 2**63 - 1, 2)
    with pytest.raises(ValueError, match="seeds"):
        step_uniforms([1, 2], [0], 3)


def test_no_drafts_is_the_plain_samplers_draw():
    """lengths 0 with the resample stream at the token's position: exactly the token the plain
    sampler (kernels.sampling, same uniform) draws from the same distribution."""
    r, v = 400, 97
    logits = torch.randn(r, v, generator=torch.Generator().manual_seed(5)) * 3
    p = torch.softmax(logits, -1)
    seeds, pos = list(range(r)), [17 + i for i in range(r)]
    u_acc, u_res = step_uniforms(seeds, pos, 0)
    n, tok = accept_sampled(
        torch.zeros(r, 0, dtype=torch.long), torch.zeros(r, dtype=torch.long), None,
        p[:, None], u_acc, u_res,
    )  # fmt: skip
    ones = torch.ones(r)
    want = sample_torch(logits, ones, ones, torch.zeros(r, dtype=torch.long), u_res[:, 0])
    assert n.tolist() == [0] * r
    assert tok.tolist() == want.tolist()


def test_degenerate_rows():
    v = 5
    onehot = torch.zeros(v)
    onehot[3] = 1.0
    p = torch.stack([onehot, onehot, onehot])[None].repeat(3, 1, 1)  # [3, 3, 5]
    draft = torch.tensor([[3, 3], [1, 3], [3, 3]])
    lengths = torch.tensor([2, 2, 0])
    u = torch.full((3, 2), 0.999999)
    # q None: a draft the target is sure of is always accepted, one it never emits never is;
    # the emitted token is always 3 (the residual and the bonus draw have only it).
    n, nxt = accept_sampled(draft, lengths, None, p, u, torch.tensor([0.0, 0.5, 0.9999999]))
    assert n.tolist() == [2, 0, 0]
    assert nxt.tolist() == [3, 3, 3]
    # Unnormalised weights are normalised; u at (or even past) the top never lands on a
    # zero-weight token.
    w = torch.tensor([[[0.0, 2.0, 0.0, 2.0, 0.0]]])
    for top in (1.0 - 2**-53, 1.0):
        n, nxt = accept_sampled(
            torch.zeros(1, 0, dtype=torch.long), torch.tensor([0]), None, w,
            torch.zeros(1, 0), torch.tensor([top]),
        )  # fmt: skip
        assert nxt.tolist() == [3]
    # A rejection with nothing left in the residual: p one ulp below q at the draft and equal
    # elsewhere, a test u so close to 1 that u * q(x) rounds to p(x). max(0, p - q) is all
    # zero; the draw falls back to p (not to an index past the vocabulary).
    q = torch.tensor([[[0.5, 0.25, 0.25]]], dtype=torch.float64)
    p = torch.tensor([[[math.nextafter(0.5, 0), 0.25, 0.25], [0.2, 0.3, 0.5]]], dtype=torch.float64)
    for u_res, want in ((0.1, 0), (0.6, 1), (0.9, 2)):
        n, nxt = accept_sampled(
            torch.tensor([[0]]), torch.tensor([1]), q, p,
            torch.tensor([[1.0 - 2**-53]], dtype=torch.float64), torch.tensor([u_res]),
        )  # fmt: skip
        assert (n.item(), nxt.item()) == (0, want)
    # q equal to p: every draft accepted whatever u.
    draft, lengths, q, _ = _batch(6, 3, 20, seed=2)
    p = torch.cat([q, q[:, :1]], 1)
    n, _ = accept_sampled(draft, lengths, q, p, torch.full((6, 3), 0.999), torch.zeros(6))
    assert n.tolist() == lengths.tolist()
    # An empty batch, and a step with no draft column at all.
    n, nxt = accept_sampled(
        torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, dtype=torch.long), None,
        torch.zeros(0, 3, 4), torch.zeros(0, 2), torch.zeros(0),
    )  # fmt: skip
    assert n.shape == nxt.shape == (0,)


def test_sampled_checks_its_input():
    draft, lengths, q, p = _batch(2, 3, 8, seed=4)
    u_a, u_r = torch.zeros(2, 3), torch.zeros(2)
    with pytest.raises(ValueError, match="p must be"):
        accept_sampled(draft, lengths, q, p[:, :3], u_a, u_r)
    with pytest.raises(ValueError, match="q must be"):
        accept_sampled(draft, lengths, q[:, :, :7], p, u_a, u_r)
    with pytest.raises(ValueError, match="u_accept"):
        accept_sampled(draft, lengths, q, p, u_a[:, :2], u_r)
    with pytest.raises(ValueError, match="u_resample"):
        accept_sampled(draft, lengths, q, p, u_a, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="non-negative"):
        accept_sampled(draft, lengths, q, -p, u_a, u_r)
    bad = p.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        accept_sampled(draft, lengths, q, bad, u_a, u_r)
    with pytest.raises(ValueError, match="positive mass"):
        accept_sampled(draft, lengths, q, torch.zeros_like(p), u_a, u_r)
    with pytest.raises(ValueError, match="lengths must lie"):
        accept_sampled(draft, torch.tensor([4, 0]), q, p, u_a, u_r)
