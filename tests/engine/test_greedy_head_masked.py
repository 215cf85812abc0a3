"""The greedy head's masked argmax (kernels.greedy_head.MaskedGreedy, settled by
kernels.greedy_masked), which a grammar-constrained row whose argmax its grammar refuses takes
instead of its whole fp32 logits row, against the fp32 logits masked and arg-maxed in torch;
every case through the numba kernel and the torch path (the `kind` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from deepring.kernels.greedy_head import GreedyArgmax, GreedyHead, MaskedGreedy
from deepring.kernels.greedy_masked import _popcount


def pack(allowed: torch.Tensor) -> np.ndarray:
    """bool [n, V] as packed int32 words [n, ceil(V / 32)], as a grammar's masks come
    (greedy_masked.unpack's inverse)."""
    a = allowed.numpy()
    pad = (-a.shape[1]) % 32
    if pad:
        a = np.pad(a, ((0, 0), (0, pad)))
    return np.packbits(a, axis=1, bitorder="little").view(np.int32)


def _masked_fp32_argmax(y: torch.Tensor, w: torch.Tensor, allowed: torch.Tensor) -> list[int]:
    logits = F.linear(y, w).masked_fill(~allowed[:, : w.shape[0]], float("-inf"))
    return logits.argmax(-1).tolist()


def _masked(head: GreedyHead, y, w, allowed, rows=None) -> list:
    head.argmax(y, w)
    rows = list(range(y.shape[0])) if rows is None else rows
    if head.last is None:  # no approximate logits (rows past fp16's range): GreedyArgmax.masker
        return [None] * len(rows)  # then gives none, and the caller computes the rows' logits
    return MaskedGreedy(head.last, w)(rows, pack(allowed), allowed.shape[1])


@pytest.mark.parametrize("density", [0.9, 0.5, 0.05, 0.0005])
@pytest.mark.parametrize("vocab", [1003, 20 * 128, 40 * 128 + 77])
def test_random_masks_match_the_masked_fp32_argmax(kind, density, vocab):
    g = torch.Generator().manual_seed(vocab)
    w = torch.randn(vocab, 64, generator=g)
    y = torch.randn(64, 64, generator=g) * 3
    allowed = torch.rand(64, vocab, generator=g) < density
    allowed[torch.arange(64), torch.randint(0, vocab, (64,), generator=g)] = True  # >= 1 each
    got = _masked(GreedyHead(kind), y, w, allowed)
    assert None not in got  # nothing here needs the fp32 fallback
    assert got == _masked_fp32_argmax(y, w, allowed)


def test_the_refused_winner_and_near_ties_below_bf16_resolution(kind):
    """Token 0 wins every row unmasked and is refused; tokens 100..139 tie at ~65 within
    bf16's resolution and row i favours 100 + i by 1e-4: the masked argmax is 100 + i."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(500, 64, generator=g) * 0.1
    w[0] = 2.0
    for t in range(40):
        w[100 + t] = 1.0
        w[100 + t, t] += 1e-4
    y = torch.ones(40, 64) + torch.eye(40, 64)
    allowed = torch.ones(40, 500, dtype=torch.bool)
    allowed[:, 0] = False
    assert _masked(GreedyHead(kind), y, w, allowed) == [100 + i for i in range(40)]


def test_exact_ties_among_allowed_tokens_pick_the_first(kind):
    w = torch.randn(300, 32, generator=torch.Generator().manual_seed(2)) * 0.1
    w[17] = w[123] = w[250] = torch.ones(32)
    y = torch.ones(3, 32)
    allowed = torch.ones(3, 300, dtype=torch.bool)
    allowed[0, 17] = False  # row 0: 123 and 250 tie; row 1: all three; row 2: only 250
    allowed[2, 17] = allowed[2, 123] = False
    assert _masked(GreedyHead(kind), y, w, allowed) == [123, 17, 250]


def test_allowed_tokens_all_negative_beside_positive_refused_ones(kind):
    g = torch.Generator().manual_seed(3)
    w = -torch.rand(600, 16, generator=g) - 0.5  # every logit of a positive row is negative
    w[:200] *= -1  # but these are positive, and refused
    y = torch.rand(8, 16, generator=g) + 0.1
    allowed = torch.zeros(8, 600, dtype=torch.bool)
    allowed[:, 200:] = True
    got = _masked(GreedyHead(kind), y, w, allowed)
    assert got == _masked_fp32_argmax(y, w, allowed)


def test_a_subset_of_rows_and_a_padded_head(kind):
    """Rows are those of the argmax call; the mask may be narrower than a padded head (the
    padding is never allowed)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(1030, 32, generator=g)
    y = torch.randn(10, 32, generator=g)
    head = GreedyHead(kind)
    head.argmax(y, w)
    rows = [7, 2, 9]
    allowed = torch.rand(3, 1000, generator=g) < 0.3
    got = MaskedGreedy(head.last, w)(rows, pack(allowed), 1000)
    padded = F.pad(allowed, (0, 30))
    assert got == _masked_fp32_argmax(y[rows], w, padded)
    assert all(t < 1000 for t in got)


def test_a_row_the_bounds_cannot_settle_is_answered_none(kind):
    """Logits past bf16's range leave no finite threshold: the settle falls back to the plain
    fp32 argmax, which knows no mask; a refused winner from it must not come back."""
    w = torch.zeros(400, 8)
    w[5] = 1.0
    w[300] = 0.5
    y = torch.full((2, 8), 1e37)
    allowed = torch.ones(2, 400, dtype=torch.bool)
    allowed[0, 5] = False  # row 0: the unmasked winner is refused
    got = _masked(GreedyHead(kind), y, w, allowed)
    assert got[0] in (None, 300)
    assert got[1] in (None, 5)  # (the torch path's plain fallback answers it; numba leaves it)


def test_the_masker_is_bound_to_its_call_and_absent_on_the_fp32_path(monkeypatch):
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", "bf16")
    g = torch.Generator().manual_seed(5)
    w = torch.randn(700, 32, generator=g)
    y1, y2 = torch.randn(4, 32, generator=g), torch.randn(6, 32, generator=g)
    head = GreedyArgmax()
    head(y1, w)
    first = head.masker(w)
    head(y2, w)  # a later call does not change what the first masker settles
    allowed = torch.rand(4, 700, generator=g) < 0.5
    assert first([0, 1, 2, 3], pack(allowed), 700) == _masked_fp32_argmax(y1, w, allowed)
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", "fp32")
    head(y1, w)
    assert head.masker(w) is None


def test_many_allowed_tokens_far_below_the_refused_ones(kind):
    """Over 2,048 allowed tokens, all below every refused one: the tile walk passes the refused
    tiles first (and may give up after MAX_TILES of them: None, never a refused token)."""
    g = torch.Generator().manual_seed(6)
    vocab = 300 * 128
    w = torch.randn(vocab, 16, generator=g) * 0.01
    y = torch.rand(4, 16, generator=g) + 0.5
    allowed = torch.zeros(4, vocab, dtype=torch.bool)
    allowed[:, : 10 * 128] = True
    # Every refused token above every allowed one, spread so that a few tiles lead.
    w[10 * 128 :] += torch.linspace(1, 3, vocab - 10 * 128)[:, None]
    allowed[2] = False
    allowed[2, 5 * 128 :] = True  # row 2: the refused tokens are few and the best is allowed
    got = _masked(GreedyHead(kind), y, w, allowed)
    want = _masked_fp32_argmax(y, w, allowed)
    assert got[2] == want[2]
    assert all(t in (None, u) for t, u in zip(got, want, strict=True))


@pytest.mark.parametrize("density", [0.9, 0.3, 0.02])
def test_the_walk_settles_with_a_membership_test_or_says_none(kind, density):
    """A refused lazy row walks its WALK largest approximate logits with the grammar's
    membership test (MaskedGreedy.walk): where it answers, the masked fp32 argmax; it answers
    dense rows, and says None rather than guess where the allowed tokens lie deeper."""
    g = torch.Generator().manual_seed(7)
    vocab = 3000
    w = torch.randn(vocab, 32, generator=g)
    y = torch.randn(24, 32, generator=g)
    allowed = torch.rand(24, vocab, generator=g) < density
    head = GreedyHead(kind)
    head.argmax(y, w)
    masked = MaskedGreedy(head.last, w)
    want = _masked_fp32_argmax(y, w, allowed)
    got = [masked.walk(r, lambda j, r=r: bool(allowed[r, j])) for r in range(24)]
    assert all(t in (None, u) for t, u in zip(got, want, strict=True))
    answered = sum(t is not None for t in got)
    if density >= 0.3:
        assert answered == 24
    # One allowed token, ranked below the walk: None (unless it happens to rank within it).
    lowest = y @ w.T
    for r in range(3):
        j = int(lowest[r].argmin())
        assert masked.walk(r, lambda t, j=j: t == j) is None


def test_popcount_counts_bits():
    x = np.random.default_rng(0).integers(-(2**31), 2**31, 5000).astype(np.int32)
    assert [int(_popcount(v)) for v in x] == [bin(int(v) & 0xFFFFFFFF).count("1") for v in x]
