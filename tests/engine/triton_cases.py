"""Every Triton kernel against its torch reference.

Not collected by the main run (its name does not start with test_): test_kernels_triton.py runs
this file in a subprocess, under TRITON_INTERPRET=1 on CPU (which must be set before triton is
imported) and on a CUDA device when there is one. Interpreter limits shape the cases: tiny grids,
fp32 (the interpreter computes bf16 wrongly).
"""

from __future__ import annotations

import pytest
import torch
from triton_interp import interpreter_or_skip

INTERPRET = interpreter_or_skip()

from deepring.kernels import (  # noqa: E402
    attention_decode,
    attention_prefill,
    indexer,
    moe,
    quant_gemm,
    rmsnorm,
    rope,
    sampling,
)
from deepring.kernels.attention_prefill import SeqLayout  # noqa: E402
from quant_helpers import quantize_fp8, quantize_mxfp4  # noqa: E402

DEV = "cpu" if INTERPRET else "cuda"
DTYPES = [torch.float32] if INTERPRET else [torch.float32, torch.bfloat16]


def tol(dtype: torch.dtype) -> dict:
    return {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}


def rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_rmsnorm(dtype, weighted):
    x = rand(5, 37, dtype=dtype)
    w = rand(37, seed=1) if weighted else None
    torch.testing.assert_close(
        rmsnorm.rms_norm_triton(x, w, 1e-6), rmsnorm.rms_norm_torch(x, w, 1e-6), **tol(dtype)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("shape", [(4, 3, 24), (4, 24)])
def test_rope(dtype, inverse, shape):
    x = rand(*shape, dtype=dtype)
    ang = rand(4, 4, seed=2) * 3
    cos, sin = ang.cos(), ang.sin()
    torch.testing.assert_close(
        rope.apply_rope_triton(x, cos, sin, inverse),
        rope.apply_rope_torch(x, cos, sin, inverse),
        **tol(dtype),
    )


def _layout(starts, lens, slots, block_tables) -> SeqLayout:
    offsets, positions, token_seq = [], [], []
    for s, (p0, n) in enumerate(zip(starts, lens, strict=True)):
        offsets.append(len(positions))
        positions += range(p0, p0 + n)
        token_seq += [s] * n

    def t(v):
        return torch.tensor(v, dtype=torch.long, device=DEV)

    return SeqLayout(
        offsets=offsets,
        lens=list(lens),
        starts=list(starts),
        slots=t(slots),
        block_tables=t(block_tables),
        token_seq=t(token_seq),
        positions=t(positions),
        starts_t=t(starts),
        offsets_t=t(offsets),
    )


# Two requests: one continuing at position 21 (window history in its ring), one fresh.
WINDOW, RING, RATIO, BLOCK = 8, 10, 4, 16
STARTS, LENS, SLOTS = [21, 0], [6, 9], [2, 0]
TABLES = [[3, 1, 4], [5, 0, 0]]


def _attn_inputs(dtype, h=3, d=32):
    t = sum(LENS)
    q = rand(t, h, d, dtype=dtype, seed=3)
    kv = rand(t, d, dtype=dtype, seed=4)
    ring = rand(4, RING, d, dtype=dtype, seed=5)
    comp = rand(8, BLOCK // RATIO, d, dtype=dtype, seed=6)
    sinks = rand(h, seed=7)
    return q, kv, ring, comp, sinks


def _topk_idx(layout: SeqLayout, k: int, seed: int) -> torch.Tensor:
    """Random distinct causal entries per row, -1 padded (what the indexer hands over)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for pos in layout.positions.tolist():
        n = (pos + 1) // RATIO
        pick = torch.randperm(n, generator=g)[:k].tolist() if n else []
        rows.append(pick + [-1] * (k - len(pick)))
    return torch.tensor(rows, dtype=torch.long, device=DEV)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
def test_prefill_attention_with_window_floors(dtype, mode):
    """Prefix-cache replay: the first request sees no window key below position 19."""
    q, kv, ring, comp, sinks = _attn_inputs(dtype)
    lay = _layout(STARTS, LENS, SLOTS, TABLES)
    lay.window_floors = [19, 0]
    lay.window_floors_t = torch.tensor(lay.window_floors, dtype=torch.long, device=DEV)
    comp_t = None if mode == "window" else comp
    idx = _topk_idx(lay, 3, 8) if mode == "topk" else None
    args = (q, kv, ring, comp_t, lay, idx, RATIO, sinks, 32**-0.5, WINDOW)
    torch.testing.assert_close(
        attention_prefill.prefill_attention_triton(*args, block_n=16),
        attention_prefill.prefill_attention_torch(*args),
        **tol(dtype),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
def test_prefill_attention(dtype, mode):
    q, kv, ring, comp, sinks = _attn_inputs(dtype)
    lay = _layout(STARTS, LENS, SLOTS, TABLES)
    comp_t = None if mode == "window" else comp
    idx = _topk_idx(lay, 3, 8) if mode == "topk" else None
    args = (q, kv, ring, comp_t, lay, idx, RATIO, sinks, 32**-0.5, WINDOW)
    torch.testing.assert_close(
        attention_prefill.prefill_attention_triton(*args, block_n=16),
        attention_prefill.prefill_attention_torch(*args),
        **tol(dtype),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["window", "dense", "topk"])
def test_decode_attention(dtype, mode):
    q, kv, ring, comp, sinks = _attn_inputs(dtype, h=5)
    q, kv = q[:3], kv[:3]
    pos = torch.tensor([0, 6, 37], device=DEV)
    slots = torch.tensor([1, 0, 2], device=DEV)
    tables = torch.tensor([[2, 0, 0], [6, 0, 0], [3, 1, 7]], device=DEV)
    lay = _layout([0, 6, 37], [1, 1, 1], [1, 0, 2], tables.tolist())
    comp_t = None if mode == "window" else comp
    idx = _topk_idx(lay, 4, 9) if mode == "topk" else None
    args = (q, kv, ring, comp_t, pos, slots, tables, idx, RATIO, sinks, 32**-0.5, WINDOW)
    torch.testing.assert_close(
        attention_decode.decode_attention_triton(*args, block_n=16),
        attention_decode.decode_attention_torch(*args),
        **tol(dtype),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_indexer_scores_and_topk(dtype):
    lay = _layout(STARTS, LENS, SLOTS, TABLES)
    t = sum(LENS)
    q = rand(t, 3, 16, dtype=dtype, seed=10)
    w = rand(t, 3, seed=11)
    cache = rand(8, BLOCK // RATIO, 16, dtype=dtype, seed=12)
    got = indexer.indexer_scores_triton(q, w, cache, lay, RATIO, 0.25, block_n=16)
    want = indexer.indexer_scores_torch(q, w, cache, lay, RATIO, 0.25)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin], **tol(dtype))
    if dtype == torch.float32:
        assert torch.equal(indexer.select_topk(got, 3), indexer.select_topk(want, 3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_experts(dtype):
    n, e, k, d, inter = 5, 4, 2, 32, 48
    x = rand(n, d, dtype=dtype, seed=13)
    idx = torch.stack(
        [torch.randperm(e, generator=torch.Generator().manual_seed(i))[:k] for i in range(n)]
    ).to(DEV)
    w = rand(n, k, seed=14).abs()
    gate_up = rand(e, 2 * inter, d, dtype=dtype, seed=15, scale=0.5)
    down = rand(e, d, inter, dtype=dtype, seed=16, scale=0.5)
    torch.testing.assert_close(
        moe.moe_experts_triton(x, idx, w, gate_up, down, 1.5, block_m=16, block_n=16, block_k=16),
        moe.moe_experts_torch(x, idx, w, gate_up, down, 1.5),
        **tol(dtype),
    )


@pytest.mark.parametrize(("n", "k", "block"), [(40, 64, 32), (33, 96, 32), (20, 128, 128)])
def test_fp8_block_linear(n, k, block):
    """FP8 e4m3 with UE8M0 block scales (partial blocks at the edges), against the weight the
    test's quantiser says the bytes stand for (tests/engine/quant_helpers.py)."""
    w = rand(n, k, seed=21).cpu() * torch.linspace(0.01, 30, k)  # blocks of different scales
    q, scale, deq = quantize_fp8(w, block)
    x = rand(5, k, seed=22)
    got = quant_gemm.fp8_block_linear(x, q.to(DEV), scale.to(DEV), block)
    torch.testing.assert_close(got, x @ deq.to(DEV).T, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(("n", "k"), [(40, 64), (17, 96)])
def test_mxfp4_linear(n, k):
    w = rand(n, k, seed=23).cpu() * torch.linspace(0.05, 8, k)
    packed, scale, deq = quantize_mxfp4(w)
    x = rand(3, k, seed=24)
    got = quant_gemm.mxfp4_linear(x, packed.to(DEV), scale.to(DEV))
    torch.testing.assert_close(got, x @ deq.to(DEV).T, atol=1e-4, rtol=1e-5)


def test_quantised_gemm_shapes_are_checked():
    x = rand(2, 64)

    def zeros(*shape, dtype=torch.uint8):
        return torch.zeros(*shape, dtype=dtype, device=DEV)

    with pytest.raises(ValueError, match="scale grid"):
        quant_gemm.fp8_block_linear(x, zeros(40, 64), zeros(1, 1), 32)
    with pytest.raises(ValueError, match="needs a scale of shape"):
        quant_gemm.mxfp4_linear(x, zeros(8, 32), zeros(8, 1))
    with pytest.raises(ValueError, match="must hold bytes"):
        quant_gemm.mxfp4_linear(x, zeros(8, 32, dtype=torch.float32), zeros(8, 2))


def test_sampling():
    v = 40
    logits = rand(6, v, seed=17, scale=2.0)
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1  # a tie for greedy
    temp = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.5], device=DEV)
    top_p = torch.tensor([1.0, 1.0, 0.8, 1.0, 0.5, 0.9], device=DEV)
    top_k = torch.tensor([-1, -1, -1, 5, 12, 3], device=DEV)
    for seed in range(5):
        u = torch.rand(6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        u = u.to(DEV)
        got = sampling.sample_triton(logits, temp, top_p, top_k, u, block=16)
        want = sampling.sample_torch(logits, temp, top_p, top_k, u)
        assert got.tolist() == want.tolist()


def test_sampling_with_masked_tokens():
    """Rows whose logits hold -inf (min_p's cut and grammar masks send them): the kernel keeps
    them out exactly as the reference does, at every filter."""
    v = 40
    logits = rand(6, v, seed=19, scale=2.0)
    logits[:, ::3] = float("-inf")
    logits[2, :-2] = float("-inf")  # one token left (38; 39 is masked too)
    temp = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.5], device=DEV)
    top_p = torch.tensor([1.0, 1.0, 0.8, 1.0, 0.5, 0.9], device=DEV)
    top_k = torch.tensor([-1, -1, -1, 30, 12, 3], device=DEV)
    for seed in range(5):
        u = torch.rand(6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        u = u.to(DEV)
        got = sampling.sample_triton(logits, temp, top_p, top_k, u, block=16)
        want = sampling.sample_torch(logits, temp, top_p, top_k, u)
        assert got.tolist() == want.tolist()
        assert not any(t % 3 == 0 for t in got.tolist())


def test_whole_model_through_triton_kernels(monkeypatch):
    """The model's forward with every kernel on the Triton path equals the reference path, for
    a chunked prefill followed by batched decode steps (CSA, HCA and sliding layers)."""
    import sys
    from pathlib import Path

    from deepring.kernels import dispatch
    from deepring.model.batch import SeqChunk

    sys.path.insert(0, str(Path(__file__).parent))
    from v4_helpers import model_config, ours, pool_for, step

    model = ours(model_config("swa-csa-hca"), seed=3).to(DEV)
    ids = torch.randint(0, 512, (30,), generator=torch.Generator().manual_seed(0)).tolist()

    def run(backend: str) -> torch.Tensor:
        monkeypatch.setenv("DEEPRING_KERNELS", backend)
        dispatch.reset()
        pool = pool_for(model, num_blocks=8, num_slots=2, block_size=16)
        out = [
            step(
                model,
                pool,
                [
                    SeqChunk(ids[:17], 0, 0, [1, 2], logits="all"),
                    SeqChunk(ids[:9], 0, 1, [3, 4], logits="all"),
                ],
            )
        ]
        out.append(
            step(
                model,
                pool,
                [
                    SeqChunk(ids[17:26], 17, 0, [1, 2], logits="all"),
                    SeqChunk([ids[9]], 9, 1, [3, 4], logits="all"),
                ],
            )
        )
        for i in range(2):
            out.append(
                step(
                    model,
                    pool,
                    [
                        SeqChunk([ids[26 + i]], 26 + i, 0, [1, 2]),
                        SeqChunk([ids[10 + i]], 10 + i, 1, [3, 4]),
                    ],
                )
            )
        dispatch.reset()
        return torch.cat(out)

    torch.testing.assert_close(run("triton"), run("torch"), atol=1e-4, rtol=0)
