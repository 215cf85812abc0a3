"""The numba CPU kernels against their torch references, and the dispatch between them."""

from __future__ import annotations

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
from numba_cases import hc_params, kernels

# Each kernel's row-parallel variant is checked against it wherever a test runs it (conftest).
pytestmark = pytest.mark.usefixtures("row_splits_checked")


@pytest.mark.parametrize(
    ("rows", "hc", "d", "iters"),
    [(1, 4, 128, 20), (7, 4, 64, 1), (70, 4, 32, 5), (300, 2, 16, 20), (33, 3, 8, 2)],
)
def test_hc_pre_numba_equals_torch(rows, hc, d, iters):
    g = torch.Generator().manual_seed(rows * 100 + hc)
    fn, base, scale = hc_params(g, hc, d)
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
    fn, base, scale = hc_params(g, 4, 16)
    h = torch.randn(3, 4, 16, generator=g)
    calls: list[str] = []
    import deepring.kernels.hyper as hyper

    for name in ("hc_pre_numba", "hc_pre_torch"):
        real = getattr(hyper, name)
        monkeypatch.setattr(hyper, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
    for setting, expect in (("auto", "hc_pre_numba"), ("torch", "hc_pre_torch")):
        with kernels(monkeypatch, setting):
            hc_pre(h, fn, base, scale, 3, 1e-6, 1e-6)
            hc_pre(h.bfloat16(), fn, base, scale, 3, 1e-6, 1e-6)
        # bf16 streams (a bf16 model) are not the numba kernels' dtype: the reference runs them.
        assert calls == [expect, "hc_pre_torch"], setting
        calls.clear()
    with kernels(monkeypatch, "auto"):  # merge: mixed dtypes (bf16 output) take the reference
        post, comb_t, _ = hc_pre_torch(h, fn, base, scale, 3, 1e-6, 1e-6)
        out = torch.randn(3, 16, generator=g)
        torch.testing.assert_close(
            hc_merge(h, out, post, comb_t), hc_merge_torch(h, out, post, comb_t)
        )
        merged = hc_merge(h.bfloat16(), out.bfloat16(), post, comb_t)
        assert merged.dtype == torch.bfloat16


def test_whole_model_numba_equals_torch(monkeypatch):
    """The model's forward with the numba kernels equals the reference path for a chunked
    prefill and batched decode steps (CSA, HCA and sliding layers), and so does every cache it
    leaves (window rings, compressed and index entries, compressor tail states)."""
    from deepring.model.batch import SeqChunk
    from v4_helpers import model_config, ours, pool_for, step

    model = ours(model_config("swa-csa-hca"), seed=3)
    ids = torch.randint(0, 512, (60,), generator=torch.Generator().manual_seed(0)).tolist()

    def run(backend: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with kernels(monkeypatch, backend):
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
            caches = {
                f"{i}.{name}": t
                for i, layer in enumerate(pool.layers)
                for name, t in vars(layer).items()
                if isinstance(t, torch.Tensor)
            }
            return torch.cat(out), caches

    (logits, caches), (ref_logits, ref_caches) = run("numba"), run("torch")
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)
    assert caches.keys() == ref_caches.keys()
    assert any(".comp" in k for k in caches)
    for name, t in caches.items():
        torch.testing.assert_close(t, ref_caches[name], atol=1e-5, rtol=1e-5, msg=name)


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
    from deepring.kernels.moe import route
    from deepring.model.config import HASH_MOE, MOE
    from deepring.model.moe import MoE
    from v4_helpers import model_config

    cfg = model_config(
        "swa-csa-hca", n_routed_experts=experts, num_experts_per_tok=k, scoring_func=func
    )
    g = torch.Generator().manual_seed(rows + experts + hashed)
    layer = MoE(cfg, HASH_MOE if hashed else MOE)
    r = layer.gate
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
        with kernels(monkeypatch, backend), torch.inference_mode():
            out[backend] = route(F.linear(x, r.weight), ids, layer.weights())
    (ia, wa), (ib, wb) = out["numba"], out["torch"]
    assert ia.dtype == ib.dtype == torch.long
    # Same experts in the same (descending) order, same weights.
    assert torch.equal(ia, ib)
    torch.testing.assert_close(wa, wb, atol=1e-6, rtol=1e-5)


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
        with kernels(monkeypatch, backend):
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
        with kernels(monkeypatch, backend):
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
    from deepring.kernels import moe as moe_mod
    from deepring.model.config import MOE
    from deepring.model.dummy import init_dummy_weights
    from deepring.model.moe import MoE
    from deepring.model.tiny import tiny_config

    layer = MoE(tiny_config(), MOE)
    init_dummy_weights(layer, seed=4)
    layer.requires_grad_(False)
    x = torch.randn(6, tiny_config().hidden_size, generator=torch.Generator().manual_seed(1))
    ids = torch.arange(6)
    calls = []
    real = moe_mod.moe_rows_numba
    monkeypatch.setattr(moe_mod, "moe_rows_numba", lambda *a: calls.append(1) or real(*a))
    with kernels(monkeypatch, "auto"), torch.inference_mode():
        fast = layer(x, ids)
        assert calls == [1]
        monkeypatch.setattr(moe_mod, "MOE_NUMBA_MAX_BYTES", 0)
        plain = layer(x, ids)
        assert calls == [1]
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)
