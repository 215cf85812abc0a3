"""The numba CPU kernels against their torch references, and the dispatch between them."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from deepring.kernels import dispatch
from deepring.kernels.hyper import (
    hc_merge,
    hc_merge_numba,
    hc_merge_torch,
    hc_pre,
    hc_pre_numba,
    hc_pre_torch,
)

# Each kernel's row-parallel variant is checked against it wherever a test runs it (conftest).
pytestmark = pytest.mark.usefixtures("row_splits_checked")


@contextlib.contextmanager
def _kernels(monkeypatch, backend: str):
    """DEEPRING_KERNELS=backend inside the block; the cached choice is forgotten on entry and
    on exit."""
    monkeypatch.setenv("DEEPRING_KERNELS", backend)
    dispatch.reset()
    try:
        yield
    finally:
        dispatch.reset()


def _hc_params(g: torch.Generator, hc: int, d: int) -> tuple[torch.Tensor, ...]:
    n = (2 + hc) * hc
    fn = torch.randn(n, hc * d, generator=g) * 0.1
    base = torch.randn(n, generator=g)
    # One scale per group (pre, post, comb), as HyperConnection builds it.
    s = torch.rand(3, generator=g) + 0.5
    scale = torch.cat([s[0].expand(hc), s[1].expand(hc), s[2].expand(hc * hc)])
    return fn, base, scale


@pytest.mark.parametrize(
    ("rows", "hc", "d", "iters"),
    [(1, 4, 128, 20), (7, 4, 64, 1), (70, 4, 32, 5), (300, 2, 16, 20), (33, 3, 8, 2)],
)
def test_hc_pre_numba_equals_torch(rows, hc, d, iters):
    g = torch.Generator().manual_seed(rows * 100 + hc)
    fn, base, scale = _hc_params(g, hc, d)
    # Streams of very different sizes, so the norm matters.
    h = torch.randn(rows, hc, d, generator=g) * torch.rand(rows, 1, 1, generator=g) * 10
    with torch.inference_mode():
        got = hc_pre_numba(h, fn, base, scale, iters, 1e-6, 1e-6)
        want = hc_pre_torch(h, fn, base, scale, iters, 1e-6, 1e-6)
    for name, a, b in zip(("post", "comb_t", "x"), got, want, strict=True):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b.contiguous(), atol=2e-5, rtol=1e-4, msg=name)
    # comb_t is doubly stochastic (up to eps and the iteration count's residue).
    if iters == 20:
        torch.testing.assert_close(got[1].sum(-1), torch.ones(rows, hc), atol=1e-3, rtol=0)


@pytest.mark.parametrize(("rows", "hc", "d"), [(1, 4, 128), (40, 4, 64), (5, 2, 24)])
def test_hc_merge_numba_equals_torch(rows, hc, d):
    g = torch.Generator().manual_seed(rows + hc)
    h = torch.randn(rows, hc, d, generator=g)
    out = torch.randn(rows, d, generator=g)
    post = torch.rand(rows, hc, generator=g) * 2
    comb_t = torch.rand(rows, hc, hc, generator=g)
    # A transposed (non-contiguous) comb_t, as the torch hc_pre returns it.
    comb_nc = comb_t.transpose(1, 2).contiguous().transpose(1, 2)
    got = hc_merge_numba(h, out, post, comb_nc)
    want = hc_merge_torch(h, out, post, comb_t)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_dispatch_picks_numba_for_cpu_fp32_unless_told_torch(monkeypatch):
    g = torch.Generator().manual_seed(0)
    fn, base, scale = _hc_params(g, 4, 16)
    h = torch.randn(3, 4, 16, generator=g)
    calls: list[str] = []
    import deepring.kernels.hyper as hyper

    for name in ("hc_pre_numba", "hc_pre_torch"):
        real = getattr(hyper, name)
        monkeypatch.setattr(hyper, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
    for setting, expect in (("auto", "hc_pre_numba"), ("torch", "hc_pre_torch")):
        with _kernels(monkeypatch, setting):
            hc_pre(h, fn, base, scale, 3, 1e-6, 1e-6)
            hc_pre(h.bfloat16(), fn, base, scale, 3, 1e-6, 1e-6)
        # bf16 streams (a bf16 model) are not the numba kernels' dtype: the reference runs them.
        assert calls == [expect, "hc_pre_torch"], setting
        calls.clear()
    with _kernels(monkeypatch, "auto"):  # merge: mixed dtypes (bf16 output) take the reference
        post, comb_t, _ = hc_pre_torch(h, fn, base, scale, 3, 1e-6, 1e-6)
        out = torch.randn(3, 16, generator=g)
        torch.testing.assert_close(
            hc_merge(h, out, post, comb_t), hc_merge_torch(h, out, post, comb_t)
        )
        merged = hc_merge(h.bfloat16(), out.bfloat16(), post, comb_t)
        assert merged.dtype == torch.bfloat16


def test_whole_model_numba_equals_torch(monkeypatch):
    """The model's forward with the numba kernels equals the reference path for a chunked
    prefill and batched decode steps (CSA, HCA and sliding layers)."""
    from deepring.model.batch import SeqChunk
    from v4_helpers import model_config, ours, pool_for, step

    model = ours(model_config("swa-csa-hca"), seed=3)
    ids = torch.randint(0, 512, (60,), generator=torch.Generator().manual_seed(0)).tolist()

    def run(backend: str) -> torch.Tensor:
        with _kernels(monkeypatch, backend):
            pool = pool_for(model, num_blocks=12, num_slots=3, block_size=16)
            tables = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
            out = [
                step(model, pool, [SeqChunk(ids[:17], 0, 0, tables[0], logits="all")]),
                step(
                    model,
                    pool,
                    [
                        SeqChunk(ids[17:30], 17, 0, tables[0], logits="all"),
                        SeqChunk(ids[:9], 0, 1, tables[1], logits="all"),
                    ],
                ),
            ]
            out.append(step(model, pool, [SeqChunk(ids[:1], 0, 2, tables[2])]))
            starts = [30, 9, 1]  # each request's next position
            for i in range(12):  # decode steps: windows fill, CSA and HCA entries complete
                chunks = [
                    SeqChunk([ids[(starts[s] + i) % 60]], starts[s] + i, s, tables[s])
                    for s in range(3)
                ]
                out.append(step(model, pool, chunks))
            return torch.cat(out)

    torch.testing.assert_close(run("numba"), run("torch"), atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", [(1, 8), (33, 4, 16), (300, 64), (0, 8)])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_numba_equals_torch(shape, weighted):
    from deepring.kernels.rmsnorm import rms_norm_numba, rms_norm_torch

    g = torch.Generator().manual_seed(len(shape) * 7 + shape[-1])
    x = torch.randn(*shape, generator=g) * (torch.rand(shape[0], *[1] * (len(shape) - 1)) * 5)
    w = torch.rand(shape[-1], generator=g) + 0.5 if weighted else None
    got = rms_norm_numba(x, w, 1e-6)
    assert got.shape == x.shape
    torch.testing.assert_close(got, rms_norm_torch(x, w, 1e-6), atol=1e-6, rtol=1e-5)
    # A non-contiguous input (a per-head slice) normalises the same.
    if len(shape) == 3:
        xs = x[:, 1:3]
        torch.testing.assert_close(rms_norm_numba(xs, w, 1e-6), rms_norm_torch(xs, w, 1e-6))


@pytest.mark.parametrize("func", ["sqrtsoftplus", "softmax", "sigmoid"])
@pytest.mark.parametrize("hashed", [False, True])
@pytest.mark.parametrize(("rows", "experts", "k"), [(1, 8, 2), (40, 16, 6)])
def test_router_numba_equals_torch(monkeypatch, func, hashed, rows, experts, k):
    from deepring.model.moe import Router
    from v4_helpers import model_config

    cfg = model_config(
        "swa-csa-hca", n_routed_experts=experts, num_experts_per_tok=k, scoring_func=func
    )
    g = torch.Generator().manual_seed(rows + experts + hashed)
    r = Router(cfg, hashed)
    with torch.no_grad():
        r.weight.copy_(torch.randn(r.weight.shape, generator=g) * 3)  # logits past 20 too
        if hashed:
            r.tid2eid.copy_(
                torch.stack(
                    [torch.randperm(experts, generator=g)[:k] for _ in range(cfg.vocab_size)]
                )
            )
        else:  # a bias large enough to change the picks (it steers selection only)
            r.e_score_correction_bias.copy_(torch.randn(experts, generator=g))
    x = torch.randn(rows, cfg.hidden_size, generator=g)
    ids = torch.randint(0, cfg.vocab_size, (rows,), generator=g)
    out = {}
    for backend in ("numba", "torch"):
        with _kernels(monkeypatch, backend), torch.inference_mode():
            out[backend] = r(x, ids)
    (ia, wa), (ib, wb) = out["numba"], out["torch"]
    assert ia.dtype == ib.dtype == torch.long
    # Same experts in the same (descending) order, same weights.
    assert torch.equal(ia, ib)
    torch.testing.assert_close(wa, wb, atol=1e-6, rtol=1e-5)


def test_model_load_compiles_every_kernel_for_the_types_steps_use():
    """load_model compiles the numba kernels (so the first request does not), for exactly the
    argument types a prefill and a decode step pass: the steps add no compilation."""
    from deepring.kernels import (
        attention_decode,
        attention_decode_numba,
        greedy,
        hyper,
        indexer,
        moe,
        rmsnorm,
        rope,
    )
    from deepring.model.batch import ForwardBatch, SeqChunk
    from deepring.model.loader import load_model
    from v4_helpers import model_config, pool_for, step

    kernels = [
        hyper._hc_pre_kernel,
        hyper._hc_merge_kernel,
        rmsnorm._rms_norm_numba,
        moe._route_kernel,
        rope._norm_rope_kernel,
        greedy._settle_kernel,
        greedy._quantize_kernel,
        moe._moe_rows_kernel,
        attention_decode._decode_plan_kernel,
        indexer._select_kernel,
        rope._rope_in_place_kernel,
        attention_decode_numba._decode_kernel,
        attention_decode_numba._check,
    ]
    model = load_model(model_config("swa-csa-hca"), load_format="dummy", device="cpu").model
    compiled = [len(k.signatures) for k in kernels]
    assert all(compiled), compiled
    pool = pool_for(model, num_blocks=8, num_slots=2, block_size=16)
    step(model, pool, [SeqChunk(list(range(5, 25)), 0, 0, [1, 2])])
    step(model, pool, [SeqChunk([7], 20, 0, [1, 2])])
    batch = ForwardBatch.build([SeqChunk([8], 21, 0, [1, 2])], model.rope_tables(), 16, "cpu")
    model(batch, pool, greedy=True)  # the greedy head's settling kernel
    assert [len(k.signatures) for k in kernels] == compiled


@pytest.mark.parametrize("shape", [(5, 3, 16), (9, 12), (1, 2, 8)])
@pytest.mark.parametrize("weighted", [True, False])
def test_norm_rope_numba_equals_torch(monkeypatch, shape, weighted):
    from deepring.kernels.rope import norm_rope

    g = torch.Generator().manual_seed(shape[-1] + weighted)
    x = torch.randn(*shape, generator=g) * 3
    w = torch.rand(shape[-1], generator=g) + 0.5 if weighted else None
    # cos and sin as views of complex rotations (how a CPU step passes them), rope dim 4.
    angles = torch.rand(shape[0], 2, generator=g) * 6
    cis = torch.polar(torch.ones_like(angles), angles)
    out = {}
    for backend in ("numba", "torch"):
        with _kernels(monkeypatch, backend):
            out[backend] = norm_rope(x.clone(), w, 1e-6, cis.real, cis.imag)
    assert out["numba"].shape == x.shape
    torch.testing.assert_close(out["numba"], out["torch"], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shape", [(5, 3, 16), (9, 12), (1, 2, 8)])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_in_place_numba_equals_torch(monkeypatch, shape, inverse):
    from deepring.kernels.rope import apply_rope

    g = torch.Generator().manual_seed(shape[-1] + inverse)
    x = torch.randn(*shape, generator=g)
    angles = torch.rand(shape[0], 2, generator=g) * 6
    cis = torch.polar(torch.ones_like(angles), angles)
    out = {}
    for backend in ("numba", "torch"):
        with _kernels(monkeypatch, backend):
            y = x.clone()
            out[backend] = apply_rope(y, cis.real, cis.imag, inverse, inplace=True)
            assert out[backend].data_ptr() == y.data_ptr()  # rotated where it lies
    torch.testing.assert_close(out["numba"], out["torch"], atol=1e-6, rtol=1e-5)
    assert not torch.equal(out["numba"][..., -4:], x[..., -4:])
    torch.testing.assert_close(out["numba"][..., :-4], x[..., :-4], atol=0, rtol=0)


@pytest.mark.parametrize("rows", [1, 5, 32])
@pytest.mark.parametrize(("experts", "k"), [(8, 2), (4, 3)])
def test_moe_rows_numba_equals_torch(rows, experts, k):
    """Routed experts (chosen by idx, weighted) plus the shared expert: the numba kernel equals
    the torch experts + shared MLP, including a row that picks one expert twice (a hash table
    may) and activations beyond the SwiGLU clamp."""
    from deepring.kernels import moe

    g = torch.Generator().manual_seed(rows * 10 + k)
    d, inter = 16, 8
    gate_up = torch.randn(experts, 2 * inter, d, generator=g)
    down = torch.randn(experts, d, inter, generator=g) * 0.3
    sg, su = torch.randn(inter, d, generator=g), torch.randn(inter, d, generator=g)
    sd = torch.randn(d, inter, generator=g) * 0.3
    x = torch.randn(rows, d, generator=g) * 2
    idx = torch.randint(0, experts, (rows, k), generator=g)
    idx[0, 1] = idx[0, 0]
    w = torch.rand(rows, k, generator=g)
    limit = 3.0
    want = moe.moe_experts_torch(x, idx, w, gate_up, down, limit)
    gs, us = F.linear(x, sg), F.linear(x, su)
    want = want + F.linear(moe.clamped_swiglu(gs, us, limit), sd)
    packed = moe.MoEPacked().prepare(gate_up, down, sg, su, sd, limit)
    got = moe.moe_rows_numba(packed.project(x), idx, w, packed)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    with torch.no_grad():
        down.mul_(2)  # an in-place update: the packed copy notices
    want2 = moe.moe_experts_torch(x, idx, w, gate_up, down, limit)
    want2 = want2 + F.linear(moe.clamped_swiglu(gs, us, limit), sd)
    packed.prepare(gate_up, down, sg, su, sd, limit)
    got2 = moe.moe_rows_numba(packed.project(x), idx, w, packed)
    torch.testing.assert_close(got2, want2, atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="expert width"):
        packed.project(x[:, :8])
    with pytest.raises(ValueError, match="project"):
        moe.moe_rows_numba(x, idx, w, packed)
    with pytest.raises(ValueError, match="shared_down"):
        moe.MoEPacked().prepare(gate_up, down, sg, su, sd[:, :3], limit)
    idx[rows - 1, 0] = experts
    with pytest.raises(IndexError, match="expert id"):
        moe.moe_rows_numba(packed.project(x), idx, w, packed)


def test_weight_array_is_kept_until_the_weight_changes():
    """The numba kernels' fp32 view of a weight is made once, and again after an in-place update
    or for an inference tensor (no version counter) each time."""
    w = torch.nn.Parameter(torch.arange(4.0))
    first = dispatch.weight_array(w)
    assert dispatch.weight_array(w) is first
    with torch.no_grad():
        w.mul_(2)
    assert dispatch.weight_array(w).tolist() == [0.0, 2.0, 4.0, 6.0]
    with torch.inference_mode():
        t = torch.ones(3)
        assert dispatch.weight_array(t).tolist() == [1.0, 1.0, 1.0]
    assert dispatch.weight_array(torch.ones(2, dtype=torch.bfloat16)).dtype.name == "float32"


def test_moe_layers_above_the_size_cap_keep_the_torch_path(monkeypatch):
    """The numba MoE keeps a copy of the gate / up projections, so layers whose expert weights
    exceed MOE_NUMBA_MAX_BYTES run the torch path; both give the same output."""
    from deepring.model import moe as moe_mod
    from deepring.model.config import MOE
    from deepring.model.dummy import init_dummy_weights
    from deepring.model.tiny import tiny_config

    layer = moe_mod.MoE(tiny_config(), MOE)
    init_dummy_weights(layer, seed=4)
    layer.requires_grad_(False)
    x = torch.randn(6, tiny_config().hidden_size, generator=torch.Generator().manual_seed(1))
    ids = torch.arange(6)
    calls = []
    real = moe_mod.moe_rows_numba
    monkeypatch.setattr(moe_mod, "moe_rows_numba", lambda *a: calls.append(1) or real(*a))
    with _kernels(monkeypatch, "auto"), torch.inference_mode():
        fast = layer(x, ids)
        assert calls == [1]
        monkeypatch.setattr(moe_mod, "MOE_NUMBA_MAX_BYTES", 0)
        plain = layer(x, ids)
        assert calls == [1]
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)


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
        with _kernels(monkeypatch, backend):
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
        with _kernels(monkeypatch, backend):
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


def test_every_row_parallel_variant_writes_what_its_serial_kernel_writes(row_splits_checked):
    """Random rows through each kernel that has a row-parallel variant; the fixture checks the
    variant (rows cut into 2, 3 and more ranges than rows) against the serial kernel."""
    from deepring.kernels import greedy, indexer, moe
    from deepring.kernels.attention_prefill import SeqLayout
    from deepring.kernels.rmsnorm import rms_norm_numba
    from deepring.kernels.rope import apply_rope, norm_rope

    g = torch.Generator().manual_seed(3)
    rows = 37
    fn, base, scale = _hc_params(g, 4, 16)
    h = torch.randn(rows, 4, 16, generator=g) * 3
    post, comb_t, x = hc_pre_numba(h, fn, base, scale, 20, 1e-6, 1e-6)
    hc_merge_numba(h, torch.randn(rows, 16, generator=g), post, comb_t)
    for w in (torch.rand(16, generator=g) + 0.5, None):
        rms_norm_numba(x, w, 1e-6)
        cis = torch.polar(torch.ones(rows, 2), torch.rand(rows, 2, generator=g) * 6)
        norm_rope(h.clone(), w, 1e-6, cis.real, cis.imag)
        apply_rope(h.clone(), cis.real, cis.imag, inplace=True)
    # Greedy settling: bf16 logits of a 300-token head, with a bound that leaves a few
    # candidates per row, and rows of either sign.
    head = torch.randn(300, 16, generator=g)
    y = torch.randn(rows, 16, generator=g)
    y[::5] *= -1
    approx = (y @ head.T).bfloat16()
    greedy.settle_numba(approx, torch.full((rows,), 0.05), y, head)
    experts, inter = 4, 8
    packed = moe.MoEPacked().prepare(
        torch.randn(experts, 2 * inter, 16, generator=g),
        torch.randn(experts, 16, inter, generator=g),
        torch.randn(inter, 16, generator=g),
        torch.randn(inter, 16, generator=g),
        torch.randn(16, inter, generator=g),
        3.0,
    )
    idx = torch.randint(0, experts, (rows, 2), generator=g)
    moe.moe_rows_numba(packed.project(x), idx, torch.rand(rows, 2, generator=g), packed)
    positions = torch.randint(0, 60, (rows,), generator=g)
    seqs = torch.arange(rows)
    lay = SeqLayout(list(range(rows)), [1] * rows, positions.tolist(), seqs,
                    torch.randint(0, 40, (rows, 4), generator=g), seqs, positions, positions,
                    seqs)  # fmt: skip
    cache = torch.randn(40, 4, 8, generator=g)
    indexer.indexer_topk_numba(
        torch.randn(rows, 3, 8, generator=g), torch.randn(rows, 3, generator=g), cache, lay,
        4, 5, 0.7,
    )  # fmt: skip
    bad = idx.clone()
    bad[rows - 1, 1] = experts  # checked before the parallel loop, which cannot raise
    with pytest.raises(IndexError, match="expert id"):
        moe._moe_rows_parallel(
            packed.project(x).numpy(), bad.numpy(), torch.ones(rows, 2).numpy(), packed.down,
            packed.shared_down, packed.limit, x.new_empty(rows, 16).numpy(), 2,
        )  # fmt: skip
    from deepring.kernels.attention_decode_numba import decode_attention_numba

    for mode in ("window", "dense", "topk"):
        decode_attention_numba(*_decode_case(g, mode, False, [3, 0, 2, 1, 4]))
    assert sorted(set(row_splits_checked)) == sorted([
        "_hc_merge_rows", "_hc_pre_rows", "_moe_rows_parallel", "_norm_rope_rows",
        "_rms_norm_rows", "_rope_in_place_rows", "_select_rows", "_settle_rows", "_decode_rows",
    ])  # fmt: skip


def test_run_rows_splits_only_where_each_thread_gets_enough_rows(monkeypatch):
    import numba
    import numpy as np

    calls = []
    serial = lambda *a: calls.append(("serial", a[0].shape[0]))  # noqa: E731
    parallel = lambda *a: calls.append(("parallel", a[0].shape[0], a[-1]))  # noqa: E731
    monkeypatch.setattr(dispatch, "parallel_threads", lambda: 2)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)  # already matched: not set
    monkeypatch.setattr(numba, "set_num_threads", lambda n: calls.append(("set", n)))
    for n in (7, 8, 100):
        dispatch.run_rows(serial, parallel, 4, np.zeros(n), 1.0)
    assert calls == [("serial", 7), ("parallel", 8, 2), ("parallel", 100, 2)]
    monkeypatch.setattr(dispatch, "parallel_threads", lambda: 1)  # no OpenMP layer
    dispatch.run_rows(serial, parallel, 4, np.zeros(100), 1.0)
    assert calls[-1] == ("serial", 100)


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch on n threads inside the block; torch's and numba's thread counts put back on
    exit."""
    import numba

    before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        numba.set_num_threads(numba_before)


def test_parallel_threads_follow_numba_openmp_layer_and_torch():
    import numba

    with _torch_threads(2):
        threads = dispatch.parallel_threads()
        assert threads in (1, 2)
        if threads > 1:
            assert numba.threading_layer() == "omp"
    with _torch_threads(1):
        assert dispatch.parallel_threads() == 1


def test_starting_numba_threads_leaves_torch_thread_count_alone():
    """Starting its OpenMP layer, numba sets OpenMP's thread count, which torch reads: the
    probe must put torch's back (a fresh process: the layer starts once). Serving workers run
    torch on one thread each and never start it."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "torch.set_num_threads({n})\n"
        "from deepring.kernels import dispatch\n"
        "p = dispatch.parallel_threads()\n"
        "import numba\n"
        "print(torch.get_num_threads(), p, numba.config.NUMBA_NUM_THREADS)\n"
    )
    env = {**os.environ, "NUMBA_NUM_THREADS": "3"}
    for n in (1, 2):
        out = subprocess.run(
            [sys.executable, "-c", code.format(n=n)], env=env, capture_output=True, text=True,
            check=True, timeout=120,
        ).stdout.split()  # fmt: skip
        assert out[0] == str(n), out
        assert out[2] == "3"
        assert out[1] in (("1",) if n == 1 else ("1", "2"))


def test_model_load_compiles_the_row_parallel_kernels_steps_use():
    """With torch on two threads, load_model also compiles the row-parallel variants, for the
    argument types of a prefill and a decode step big enough to split their rows."""
    from deepring.kernels import attention_decode_numba, greedy, hyper, indexer, moe, rmsnorm, rope
    from deepring.model.batch import ForwardBatch, SeqChunk
    from deepring.model.loader import load_model
    from v4_helpers import model_config, pool_for, step

    kernels = [
        hyper._hc_pre_rows, hyper._hc_merge_rows, rmsnorm._rms_norm_rows, rope._norm_rope_rows,
        rope._rope_in_place_rows, greedy._settle_rows, moe._moe_rows_parallel,
        indexer._select_rows, attention_decode_numba._decode_rows,
    ]  # fmt: skip
    with _torch_threads(2):
        if dispatch.parallel_threads() < 2:
            pytest.skip("numba has no OpenMP threading layer here: the kernels run serially")
        model = load_model(model_config("swa-csa-hca"), load_format="dummy", device="cpu").model
        compiled = [len(k.signatures) for k in kernels]
        assert all(compiled), compiled
        n = 18  # decode rows: more than the greedy head's plain-GEMM limit, enough to split
        pool = pool_for(model, num_blocks=2 * n + 1, num_slots=n, block_size=16)
        blocks = [[1 + 2 * i, 2 + 2 * i] for i in range(n)]
        step(model, pool, [SeqChunk(list(range(5, 25)), 0, i, blocks[i]) for i in range(n)])
        chunks = [SeqChunk([7 + i], 20, i, blocks[i]) for i in range(n)]
        batch = ForwardBatch.build(chunks, model.rope_tables(), 16, "cpu")
        model(batch, pool, greedy=True)
        assert [len(k.signatures) for k in kernels] == compiled


def _decode_case(g: torch.Generator, mode: str, kv_in_ring: bool, slots: list[int]) -> tuple:
    """Decode attention arguments: rows inside and past the first window (a partly empty and
    a wrapped ring), scattered block tables, CSA picks with -1 padding or HCA's every causal
    entry; with kv_in_ring the ring holds each row's new key and kv is NaN (it must be unused)."""
    h, d, ring_len, ratio, epb = 3, 16, 8, 4, 4
    positions = torch.tensor([0, 3, 6, 14, 42])
    b = len(positions)
    q, kv = torch.randn(b, h, d, generator=g), torch.randn(b, d, generator=g)
    ring = torch.randn(b, ring_len, d, generator=g)
    comp = torch.randn(64, epb, d, generator=g)
    tables = torch.randperm(64, generator=g)[: b * 12].view(b, 12)
    idx = None
    if mode == "topk":
        idx = torch.full((b, 4), -1)
        for i, p in enumerate(positions.tolist()):
            pick = torch.randperm((p + 1) // ratio, generator=g)[:4]
            idx[i, : len(pick)] = pick
    if kv_in_ring:
        ring[torch.tensor(slots), positions % ring_len] = kv
        kv = torch.full_like(kv, float("nan"))
    c = None if mode == "window" else comp
    sinks = torch.randn(h, generator=g)
    return (q, kv, ring, c, positions, torch.tensor(slots), tables, idx, ratio, sinks, 0.3, 6)


@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
@pytest.mark.parametrize("kv_in_ring", [False, True])
@pytest.mark.parametrize("slots", [[0, 1, 2, 3, 4], [4, 0, 2, 1, 3]])
def test_decode_attention_numba_equals_torch(monkeypatch, mode, kv_in_ring, slots):
    from deepring.kernels import attention_decode
    from deepring.kernels.attention_decode_numba import decode_attention_numba

    args = _decode_case(torch.Generator().manual_seed(len(mode)), mode, kv_in_ring, slots)
    _, _, ring, c, positions, sl, tables, idx, ratio, _, _, window = args
    dense = (ratio, c.shape[1]) if c is not None and idx is None else None
    plan = attention_decode.decode_plan(positions, sl, tables, ring.shape[1], window, dense,
                                        kv_in_ring)  # fmt: skip
    want = attention_decode.decode_attention_torch(*args, plan)
    got = decode_attention_numba(*args, kv_in_ring)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # The dispatcher takes the numba kernel for fp32 CPU tensors (no plan needed).
    with _kernels(monkeypatch, "auto"):
        built = []
        out = attention_decode.decode_attention(
            *args, plan=lambda: built.append(1), kv_in_ring=kv_in_ring
        )
    assert not built
    torch.testing.assert_close(out, got, atol=0, rtol=0)


def test_decode_attention_numba_rejects_indices_outside_its_arrays():
    from deepring.kernels.attention_decode_numba import decode_attention_numba

    args = list(_decode_case(torch.Generator().manual_seed(2), "topk", False, [0, 1, 2, 3, 4]))
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
