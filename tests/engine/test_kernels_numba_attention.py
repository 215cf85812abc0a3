"""The numba attention-side kernels against their torch paths: the decode plan, the indexer's
top-k (decode rows and chunks beside them) and decode attention."""

from __future__ import annotations

import pytest
import torch
from numba_cases import decode_case, kernels

# Each kernel's row-parallel variant is checked against it wherever a test runs it (conftest).
pytestmark = pytest.mark.usefixtures("row_splits_checked")


@pytest.mark.parametrize("kv_in_ring", [False, True])
@pytest.mark.parametrize("dense", [None, (4, 4), (16, 1)])
@pytest.mark.parametrize("slots", [[0, 1, 2, 3], [3, 0, 2, 1], [5]])
def test_decode_plan_numba_equals_torch(monkeypatch, kv_in_ring, dense, slots):
    """The decode plan's mask, dense rows and ring rows from the numba kernel equal the torch
    path's, for rows before and past the window and with consecutive or scattered slots."""
    from deepring.kernels import attention_decode

    positions = torch.tensor([0, 5, 17, 40][: len(slots)])
    tables = torch.tensor([[3, 1, 4], [5, 2, 7], [6, 0, 8], [9, 10, 11]])[: len(slots)]
    args = (positions, torch.tensor(slots), tables, 10, 8, dense, kv_in_ring)
    plans = {}
    for backend in ("torch", "auto"):
        with kernels(monkeypatch, backend):
            plans[backend] = attention_decode.decode_plan(*args)
    want, got = plans["torch"], plans["auto"]
    assert torch.equal(got.hidden, want.hidden)
    assert (got.dense_rows is None) == (want.dense_rows is None)
    if want.dense_rows is not None:
        assert torch.equal(got.dense_rows, want.dense_rows)
    if isinstance(want.ring_rows, tuple):
        assert got.ring_rows == want.ring_rows
    else:
        assert torch.equal(got.ring_rows, want.ring_rows)
    assert got.kv_in_ring == want.kv_in_ring


def _topk_numba_and_torch(monkeypatch, q, w, cache, lay, ratio, topk):
    """indexer_topk's picks through the numba kernel and through the torch path."""
    from deepring.kernels import indexer

    out = {}
    for backend in ("auto", "torch"):
        with kernels(monkeypatch, backend):
            out[backend] = indexer.indexer_topk(q, w, cache, lay, ratio, topk, 0.7)
    assert out["auto"].shape == out["torch"].shape
    return out["auto"], out["torch"]


@pytest.mark.parametrize("topk", [3, 8, 64])
def test_decode_indexer_topk_numba_equals_torch(monkeypatch, topk):
    """One decode row per request: the numba head sum + top-k equal the reference's scores and
    select_topk, with rows of fewer causal entries than topk, scattered block tables, and exact
    ties (zero keys, and every score of a row zero)."""
    from deepring.kernels.attention_prefill import SeqLayout

    g = torch.Generator().manual_seed(11)
    epb, di, hi, ratio = 4, 8, 3, 4
    positions = [2, 9, 40, 63, 150]
    tables = torch.zeros(5, 10, dtype=torch.long)
    tables[:4, :4] = torch.tensor([[3, 1, 7, 0], [5, 2, 0, 6], [4, 8, 9, 10], [11, 12, 13, 14]])
    tables[4] = torch.arange(20, 30)  # 37 entries, every key zero: 37 tied scores
    cache = torch.randn(30, epb, di, generator=g)
    cache[20:] = 0.0
    cache[12, 1] = cache[11, 2]  # two entries of request 3 with the same key: a tie
    cache[13, 0] = 0.0  # a zero key: score 0, tied with the entries relu zeroes
    q = torch.randn(5, hi, di, generator=g)
    w = torch.randn(5, hi, generator=g)
    lay = SeqLayout(
        offsets=list(range(5)), lens=[1] * 5, starts=positions, slots=torch.arange(5),
        block_tables=tables, token_seq=torch.arange(5), positions=torch.tensor(positions),
        starts_t=torch.tensor(positions), offsets_t=torch.arange(5),
    )  # fmt: skip
    got, want = _topk_numba_and_torch(monkeypatch, q, w, cache, lay, ratio, topk)
    assert torch.equal(got, want)
    assert (got[0, (positions[0] + 1) // ratio :] == -1).all()


@pytest.mark.parametrize("topk", [3, 8, 64])
def test_indexer_topk_numba_equals_torch_for_chunks_beside_decode_rows(monkeypatch, topk):
    """A mixed step: prefill chunks (from position 0, after earlier chunks, one too short to
    complete an entry) beside decode rows. Each chunk row picks the torch path's entries as a
    set (its attention masks by them); decode rows the same entries in the same order. Keys
    include exact ties (zero keys, scored 0 like the entries relu zeroes)."""
    from deepring.kernels.attention_prefill import SeqLayout

    g = torch.Generator().manual_seed(5 + topk)
    epb, di, hi, ratio = 4, 8, 3, 4
    starts, lens = [0, 63, 40, 0, 2, 150], [23, 1, 30, 2, 1, 9]
    offsets = [sum(lens[:i]) for i in range(len(lens))]
    positions = [p0 + r for p0, n in zip(starts, lens, strict=True) for r in range(n)]
    token_seq = [i for i, n in enumerate(lens) for _ in range(n)]
    tables = torch.randperm(80, generator=g)[:60].view(6, 10)
    cache = torch.randn(80, epb, di, generator=g)
    cache[tables[0, 1]] = 0.0  # four zero keys: tied scores
    cache[tables[2, 3], 2] = cache[tables[2, 0], 1]  # two entries with the same key
    t = len(positions)
    q = torch.randn(t, hi, di, generator=g)
    w = torch.randn(t, hi, generator=g)
    lay = SeqLayout(
        offsets=offsets, lens=lens, starts=starts, slots=torch.arange(6), block_tables=tables,
        token_seq=torch.tensor(token_seq), positions=torch.tensor(positions),
        starts_t=torch.tensor(starts), offsets_t=torch.tensor(offsets),
    )  # fmt: skip
    got, want = _topk_numba_and_torch(monkeypatch, q, w, cache, lay, ratio, topk)
    decode_rows = [offsets[i] for i, n in enumerate(lens) if n == 1]
    assert torch.equal(got[decode_rows], want[decode_rows])
    assert torch.equal(got.sort(-1).values, want.sort(-1).values)
    assert (got[offsets[3] : offsets[3] + 2] == -1).all()  # no entry complete yet


@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
@pytest.mark.parametrize("kv_in_ring", [False, True])
@pytest.mark.parametrize("slots", [[0, 1, 2, 3, 4], [4, 0, 2, 1, 3]])
def test_decode_attention_numba_equals_torch(monkeypatch, mode, kv_in_ring, slots):
    from deepring.kernels import attention_decode
    from deepring.kernels.attention_decode_numba import decode_attention_numba

    args = decode_case(torch.Generator().manual_seed(len(mode)), mode, kv_in_ring, slots)
    _, _, ring, c, positions, sl, tables, idx, ratio, _, _, window = args
    dense = (ratio, c.shape[1]) if c is not None and idx is None else None
    plan = attention_decode.decode_plan(positions, sl, tables, ring.shape[1], window, dense,
                                        kv_in_ring)  # fmt: skip
    want = attention_decode.decode_attention_torch(*args, plan)
    got = decode_attention_numba(*args, kv_in_ring)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The dispatcher takes the numba kernel for fp32 CPU tensors (no plan needed).
    with kernels(monkeypatch, "auto"):
        built = []
        out = attention_decode.decode_attention(
            *args, plan=lambda: built.append(1), kv_in_ring=kv_in_ring
        )
    assert not built
    torch.testing.assert_close(out, got, atol=0, rtol=0)


def test_decode_attention_numba_rejects_indices_outside_its_arrays():
    from deepring.kernels.attention_decode_numba import decode_attention_numba

    args = list(decode_case(torch.Generator().manual_seed(2), "topk", False, [0, 1, 2, 3, 4]))
    cases = [
        (5, torch.tensor([0, 1, 2, 3, 5]), "slot"),  # 5 rings
        (7, torch.tensor([[0, 1, 2, 60, -1]] * 5), "block table"),  # 12 blocks of 4 entries
        (4, torch.tensor([0, 3, 7, 13, -1]), "negative"),
    ]
    for i, bad, what in cases:
        broken = list(args)
        broken[i] = bad
        with pytest.raises(IndexError, match=what):
            decode_attention_numba(*broken)
    broken = list(args)
    broken[6] = args[6].clone()
    broken[6][4, 0] = 64  # the compressed cache has 64 blocks
    with pytest.raises(IndexError, match="block id"):
        decode_attention_numba(*broken)
