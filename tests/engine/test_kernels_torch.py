"""The torch reference kernels against plain dense restatements, and their internal fast paths
(query blocking, batched decode rows, NumPy Sinkhorn) against their slow paths."""

from __future__ import annotations

import pytest
import torch
from deepring.kernels import attention_decode, attention_prefill, indexer, moe, rope
from deepring.kernels.attention_prefill import SeqLayout
from deepring.kernels.hyper import sinkhorn

WINDOW, RING, RATIO, BLOCK = 6, 8, 4, 16


def _layout(starts, lens, slots, tables) -> SeqLayout:
    offsets, positions, token_seq = [], [], []
    for s, (p0, n) in enumerate(zip(starts, lens, strict=True)):
        offsets.append(len(positions))
        positions += range(p0, p0 + n)
        token_seq += [s] * n

    def t(v):
        return torch.tensor(v, dtype=torch.long)

    return SeqLayout(offsets, list(lens), list(starts), t(slots), t(tables), t(token_seq),
                     t(positions), t(starts), t(offsets))  # fmt: skip


def _dense_reference(q, kv, ring, comp, lay, comp_idx, ratio, sinks, scale, window):
    """Attention written out key by key from the definition (no blocking, no batching)."""
    out = torch.zeros_like(q)
    for s, (a, n, p0) in enumerate(zip(lay.offsets, lay.lens, lay.starts, strict=True)):
        slot = int(lay.slots[s])
        for r in range(n):
            pos = p0 + r
            keys = []
            for kp in range(max(lay.floor(s), pos - window + 1), pos + 1):
                keys.append(ring[slot, kp % RING] if kp < p0 else kv[a + kp - p0])
            if comp is not None:
                if comp_idx is not None:
                    ents = [e for e in comp_idx[a + r].tolist() if e >= 0]
                else:
                    ents = list(range((pos + 1) // ratio))
                epb = comp.shape[1]
                keys += [comp[lay.block_tables[s, e // epb], e % epb] for e in ents]
            k = torch.stack(keys)
            logits = torch.cat([(k @ q[a + r].T).T * scale, sinks[:, None]], 1)
            out[a + r] = torch.softmax(logits, -1)[:, :-1] @ k
    return out


def _prefill_case(lay: SeqLayout, mode: str, seed: int) -> tuple:
    """Random prefill attention arguments for `lay`; mode: window (no compressed entries),
    dense (every causal entry) or topk (3 random entries per row)."""
    g = torch.Generator().manual_seed(seed)
    t = sum(lay.lens)
    q, kv = torch.randn(t, 3, 16, generator=g), torch.randn(t, 16, generator=g)
    ring = torch.randn(3, RING, 16, generator=g)
    comp = torch.randn(8, BLOCK // RATIO, 16, generator=g)
    sinks = torch.randn(3, generator=g)
    idx = None
    if mode == "topk":
        idx = torch.full((t, 3), -1)
        for i, pos in enumerate(lay.positions.tolist()):
            pick = torch.randperm((pos + 1) // RATIO, generator=g)[:3]
            idx[i, : len(pick)] = pick
    c = None if mode == "window" else comp
    return (q, kv, ring, c, lay, idx, RATIO, sinks, 0.3, WINDOW)


# flash: blocks through ATen's fused CPU attention (the sink applied from its log-sum-exp), or
# through GEMMs + softmax with the sink as one more logit.
FLASH = [False, True]


@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
@pytest.mark.parametrize("block_q", [1, 3, 128])
@pytest.mark.parametrize("flash", FLASH)
def test_prefill_attention_reference(mode, block_q, flash):
    lay = _layout([13, 0, 5], [9, 11, 1], [2, 0, 1], [[3, 1, 4], [5, 0, 0], [6, 0, 0]])
    args = _prefill_case(lay, mode, seed=0)
    q, kv, ring, c, _, idx, _, sinks, _, _ = args
    got = attention_prefill.prefill_attention_torch(*args, block_q=block_q, flash=flash)
    torch.testing.assert_close(got, _dense_reference(*args), atol=1e-5, rtol=1e-5)
    if all(n == 1 for n in lay.lens):
        return
    # Single-row requests through the decode kernel agree with the prefill kernel.
    single = [i for i, n in enumerate(lay.lens) if n == 1]
    rows = lay.offsets_t[single]
    dec = attention_decode.decode_attention_torch(
        q[rows], kv[rows], ring, c, lay.positions[rows], lay.slots[single],
        lay.block_tables[single], None if idx is None else idx[rows], RATIO, sinks, 0.3, WINDOW,
    )  # fmt: skip
    torch.testing.assert_close(dec, got[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
@pytest.mark.parametrize(
    ("starts", "lens"),
    [
        ([0, 0, 0], [9, 9, 9]),  # one group, adjacent rows: viewed, not copied
        ([5, 0, 5], [7, 9, 7]),  # a group of two with a request between them
        ([13, 13, 2], [4, 4, 4]),  # equal lengths, two starts: history from the ring
    ],
)
@pytest.mark.parametrize("flash", FLASH)
def test_prefill_attention_groups_equal_shapes(mode, starts, lens, flash):
    """Requests with the same start and length run as one batched group."""
    lay = _layout(starts, lens, [2, 0, 1], [[3, 1, 4], [5, 2, 7], [6, 0, 0]])
    args = _prefill_case(lay, mode, seed=7)
    want = _dense_reference(*args)
    for block_q in (2, 128):
        got = attention_prefill.prefill_attention_torch(*args, block_q=block_q, flash=flash)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
@pytest.mark.parametrize("slots", [[0, 1, 2], [2, 0, 1]])  # consecutive slots: the ring is viewed
def test_decode_attention_reference(mode, slots):
    g = torch.Generator().manual_seed(5)
    lay = _layout([13, 40, 5], [1, 1, 1], slots, [[3, 1, 4], [5, 2, 7], [6, 0, 0]])
    q, kv = torch.randn(3, 3, 16, generator=g), torch.randn(3, 16, generator=g)
    ring = torch.randn(3, RING, 16, generator=g)
    comp = torch.randn(8, BLOCK // RATIO, 16, generator=g)
    sinks = torch.randn(3, generator=g)
    idx = None
    if mode == "topk":
        idx = torch.full((3, 4), -1)
        for i, pos in enumerate(lay.positions.tolist()):
            pick = torch.randperm((pos + 1) // RATIO, generator=g)[:4]
            idx[i, : len(pick)] = pick
    c = None if mode == "window" else comp
    got = attention_decode.decode_attention_torch(
        q, kv, ring, c, lay.positions, lay.slots, lay.block_tables, idx, RATIO, sinks, 0.3, WINDOW
    )
    want = _dense_reference(q, kv, ring, c, lay, idx, RATIO, sinks, 0.3, WINDOW)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The same with the new token written into the ring first (a pure decode step's order).
    ring_now = ring.clone()
    ring_now[lay.slots, lay.positions % RING] = kv
    dense = (RATIO, comp.shape[1]) if mode == "dense" else None
    plan = attention_decode.decode_plan(
        lay.positions, lay.slots, lay.block_tables, RING, WINDOW, dense, kv_in_ring=True
    )
    got_now = attention_decode.decode_attention_torch(
        q, torch.full_like(kv, float("nan")), ring_now, c, lay.positions, lay.slots,
        lay.block_tables, idx, RATIO, sinks, 0.3, WINDOW, plan=plan,
    )  # fmt: skip
    torch.testing.assert_close(got_now, want, atol=1e-5, rtol=1e-5)
    # Without a plan, it builds the same one from kv_in_ring.
    got_built = attention_decode.decode_attention_torch(
        q, torch.full_like(kv, float("nan")), ring_now, c, lay.positions, lay.slots,
        lay.block_tables, idx, RATIO, sinks, 0.3, WINDOW, kv_in_ring=True,
    )  # fmt: skip
    torch.testing.assert_close(got_built, got_now, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("starts", "lens"),
    [
        ([20, 7, 0, 33], [1, 6, 1, 1]),  # one prefill chunk among decode rows
        ([4, 4, 0, 4], [6, 6, 1, 6]),  # equal chunks batched, one apart from the others
        ([4, 4, 9, 0], [6, 6, 5, 3]),  # equal adjacent chunks, and two of their own
    ],
)
def test_indexer_batched_rows_equal_looped_rows(starts, lens):
    g = torch.Generator().manual_seed(1)
    lay = _layout(starts, lens, [0, 1, 2, 3], [[1, 2, 0], [3, 0, 0], [4, 0, 0], [5, 6, 7]])
    t = sum(lay.lens)
    q, w = torch.randn(t, 4, 8, generator=g), torch.randn(t, 4, generator=g)
    cache = torch.randn(8, BLOCK // RATIO, 8, generator=g)
    got = indexer.indexer_scores_torch(q, w, cache, lay, RATIO, 0.5)
    for row, (s, pos) in enumerate(
        zip(lay.token_seq.tolist(), lay.positions.tolist(), strict=True)
    ):
        n = (pos + 1) // RATIO
        for e in range(got.shape[1]):
            if e >= n:
                assert got[row, e] == float("-inf")
                continue
            k = cache[lay.block_tables[s, e // 4], e % 4]
            want = (torch.relu(q[row] @ k) * 0.5 * w[row]).sum()
            torch.testing.assert_close(got[row, e], want, atol=1e-5, rtol=1e-5)


def test_topk_ties_prefer_lower_entries():
    scores = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, float("-inf")]])
    assert indexer.select_topk(scores, 2).tolist() == [[1, 2]]
    assert indexer.select_topk(scores, 6).tolist() == [[1, 2, 4, 0, 3, -1]]


# (tokens, experts): 1 x 16 gathers the picked weights, 6 x 3 runs every expert densely,
# 200 x 3 and 5 x 32 group the picks by expert.
@pytest.mark.parametrize(("n", "n_experts"), [(1, 16), (6, 3), (200, 3), (5, 32)])
def test_moe_reference_is_the_per_token_sum(n, n_experts):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, 8, generator=g)
    idx = torch.stack([torch.randperm(n_experts, generator=g)[:2] for _ in range(n)])
    w = torch.rand(n, 2, generator=g)
    gu = torch.randn(n_experts, 10, 8, generator=g)
    down = torch.randn(n_experts, 8, 5, generator=g)
    got = moe.moe_experts_torch(x, idx, w, gu, down, 1.0)
    for i in range(n):
        want = torch.zeros(8)
        for j in range(2):
            e = int(idx[i, j])
            h = gu[e] @ x[i]
            act = torch.nn.functional.silu(h[:5].clamp(max=1.0)) * h[5:].clamp(-1.0, 1.0)
            want += w[i, j] * (down[e] @ act)
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=1e-5)


def test_moe_paths_cover_the_cases_above():
    assert not moe._use_dense(1, 2, 16)  # few tokens: gathered weights
    assert moe._use_dense(6, 2, 3)
    assert not moe._use_dense(200, 2, 3)  # grouped
    assert not moe._use_dense(5, 2, 32)


def test_rope_rotates_pairs_and_inverse_undoes_it():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 2, 12, generator=g)
    ang = torch.randn(5, 2, generator=g)
    y = rope.apply_rope_torch(x, ang.cos(), ang.sin())
    assert torch.equal(y[..., :8], x[..., :8])  # the nope part is untouched
    z = torch.complex(x[..., 8::2], x[..., 9::2]) * torch.polar(torch.ones(5, 1, 2), ang[:, None])
    torch.testing.assert_close(y[..., 8::2], z.real)
    torch.testing.assert_close(y[..., 9::2], z.imag)
    torch.testing.assert_close(rope.apply_rope_torch(y, ang.cos(), ang.sin(), inverse=True), x)


def test_rope_tables_look_up_the_computed_rotations(monkeypatch):
    from deepring.model import rope as rope_mod
    from deepring.model.config import ModelConfig
    from deepring.model.presets import V4_FLASH  # YaRN on the compress kind

    monkeypatch.setattr(rope_mod, "TABLE_POSITIONS", 10000)
    tables = rope_mod.RopeTables(ModelConfig.from_hf_dict(V4_FLASH))
    g = torch.Generator().manual_seed(4)
    for kind in ("main", "compress"):
        # Below the table size (first a small table, then a grown one), then beyond it.
        for hi, shape in [(100, (7,)), (9000, (3, 5)), (20000, (6,))]:
            pos = torch.randint(0, hi, shape, generator=g)
            pos[0] = hi - 1
            expect = torch.complex(*tables.cos_sin(pos, kind))
            got = tables.cis(pos, kind)
            assert got.shape == (*shape, 32)
            assert torch.equal(got, expect), (kind, hi)
            if hi < 10000:
                assert hi <= tables._tables[kind].shape[0] <= 10000  # grown to cover, capped


@pytest.mark.parametrize("rows", [1, 63, 65, 300])
def test_sinkhorn_is_doubly_stochastic_and_equals_plain_loop(rows):
    g = torch.Generator().manual_seed(rows)
    comb = torch.softmax(torch.randn(rows, 4, 4, generator=g), -1) + 1e-6
    out = sinkhorn(comb, 20, 1e-6)
    torch.testing.assert_close(out.sum(-2), torch.ones(rows, 4), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.sum(-1), torch.ones(rows, 4), atol=1e-3, rtol=0)
    slow = comb / (comb.sum(-2, keepdim=True) + 1e-6)
    for _ in range(19):
        slow = slow / (slow.sum(-1, keepdim=True) + 1e-6)
        slow = slow / (slow.sum(-2, keepdim=True) + 1e-6)
    torch.testing.assert_close(out, slow, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("full_rows", [0, 16], ids=["tiles", "one-gemm"])
def test_greedy_tokens_equal_argmax_of_logits(monkeypatch, full_rows):
    from deepring.kernels import greedy_head
    from v4_helpers import model_config, ours

    monkeypatch.setattr(greedy_head, "GREEDY_TILE", 100)  # several tiles over a 512 vocabulary
    monkeypatch.setattr(greedy_head, "GREEDY_FULL_ROWS", full_rows)
    m = ours(model_config("hca-bootstrap"), seed=6)
    h = torch.randn(
        7, m.config.hc_mult, m.config.hidden_size, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        y = m.model.norm(m.model.hc_head(h[2:3]))[0]
        # Rows 20 and 350 (different tiles) tie as row 2's maximum: the first one must win.
        m.lm_head.weight[20] = m.lm_head.weight[350] = 50 * y / y.norm()
        logits = m.logits(h)
    assert logits[2].argmax() == 20
    assert logits[2, 20] == logits[2, 350]
    assert torch.equal(m.greedy_tokens(h), logits.argmax(-1))


def test_indexer_picks_of_multi_row_chunks_are_the_top_k_set():
    """Rows of multi-row chunks get the same set of picks as select_topk (their attention masks
    by it); single-row chunks (decode rows) get select_topk's exact order."""
    g = torch.Generator().manual_seed(3)
    lay = _layout([0, 30, 9], [40, 1, 12], [0, 1, 2], [[1, 2, 3], [4, 5, 0], [6, 7, 0]])
    t = sum(lay.lens)
    q, w = torch.randn(t, 4, 8, generator=g), torch.randn(t, 4, generator=g)
    cache = torch.randn(8, BLOCK // RATIO, 8, generator=g)
    scores = indexer.indexer_scores_torch(q, w, cache, lay, RATIO, 0.5)
    for topk in (3, 5, 100):
        want = indexer.select_topk(scores, topk)
        got = indexer.indexer_topk(q, w, cache, lay, RATIO, topk, 0.5)
        assert got.shape == want.shape
        assert torch.equal(got[40], want[40])  # the decode row, in order
        for row in range(t):
            assert sorted(got[row].tolist()) == sorted(want[row].tolist()), (topk, row)


@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
@pytest.mark.parametrize("flash", FLASH)
def test_prefill_attention_with_window_floors(mode, flash):
    """A replayed window (prefix cache): no key below a request's floor is seen, even where
    the ring holds one; requests with and without floors share the step."""
    lay = _layout([13, 6, 5], [9, 11, 7], [2, 0, 1], [[3, 1, 4], [5, 2, 7], [6, 0, 0]])
    lay.window_floors = [10, 6, 0]  # mid-ring, at the chunk start, none
    lay.window_floors_t = torch.tensor(lay.window_floors)
    args = _prefill_case(lay, mode, seed=3)
    want = _dense_reference(*args)
    for block_q in (2, 128):
        got = attention_prefill.prefill_attention_torch(*args, block_q=block_q, flash=flash)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # Poisoning the ring positions below request 0's floor (5..9: the ring of 8 before its
    # start at 13 holds 5..12) changes nothing.
    ring = args[2].clone()
    ring[2, [p % RING for p in range(5, 10)]] = float("nan")
    got = attention_prefill.prefill_attention_torch(
        args[0], args[1], ring, *args[3:], block_q=4, flash=flash
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
