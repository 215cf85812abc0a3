"""Mixture of experts: the router (learned top-k or frozen hash routing), the routed experts
(clamped SwiGLU applied to each token's top-k picks) and the layer's entry point, `moe_layer`,
which picks the backend: numba on fp32 CPU rows (kernels.moe_numba), Triton on GPUs, torch
otherwise; experts kept in MXFP4 (model.moe.Experts.keep_quantised) run moe_experts_mxfp4.

Router scores are sqrtsoftplus(logits) (or softmax / sigmoid). Learned routing picks the top-k of
score + e_score_correction_bias (the bias only steers selection); hash routing takes the experts
from the frozen tid2eid[token] table. Either way the weights are the unbiased scores of the
chosen experts, renormalised to sum to one and multiplied by routed_scaling_factor.

gate_up: [E, 2I, D] (gate rows first, then up rows); down: [E, D, I]. For a token x routed to
expert e with weight w: w * down_e(silu(min(g, limit)) * clamp(u, -limit, limit)), [g; u] =
gate_up_e x. Assignments are grouped by expert (one GEMM per expert); the k contributions of a
token are summed in a fixed order, so the result does not depend on the other tokens present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from deepring.kernels.dispatch import HAVE_TRITON, use_numba, use_triton
from deepring.kernels.moe_numba import (
    MOE_NUMBA_MAX_BYTES,
    MOE_NUMBA_ROWS,
    MoEPacked,
    moe_rows_numba,
    route_numba,
)


def _group(idx: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, list[int]]:
    order = torch.argsort(idx.reshape(-1), stable=True)
    counts = torch.bincount(idx.reshape(-1), minlength=n_experts).tolist()
    return order, counts


def clamped_swiglu(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    """V4's expert activation: silu(min(g, limit)) * clamp(u, -limit, limit)."""
    return F.silu(g.clamp(max=limit)) * u.clamp(min=-limit, max=limit)


def _moe_few_tokens(
    x: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """A handful of (token, expert) pairs (small decode batches): gather the chosen experts'
    weights and run batched mat-vecs, a few ops instead of a loop over experts."""
    n, k = idx.shape
    flat = idx.reshape(-1)
    h = torch.bmm(gate_up[flat], x.repeat_interleave(k, 0).unsqueeze(-1)).squeeze(-1)
    g, u = h.chunk(2, dim=-1)
    act = clamped_swiglu(g, u, limit)
    y = torch.bmm(down[flat], act.unsqueeze(-1)).squeeze(-1)
    return (y * weights.reshape(-1, 1).to(y.dtype)).view(n, k, -1).sum(1)


def _moe_dense(
    x: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """Every expert on every token, unchosen ones weighted zero: when the batch touches most
    experts anyway and there are few experts, a handful of large ops beats grouping and a loop
    over experts (measured 2-3x faster on CPU at 4-64 tokens, 8 experts)."""
    n = x.shape[0]
    e, i2, d = gate_up.shape
    g, u = F.linear(x, gate_up.view(e * i2, d)).view(n, e, 2, i2 // 2).unbind(2)
    act = clamped_swiglu(g, u, limit)  # [n, e, i]
    y = torch.bmm(act.transpose(0, 1), down.transpose(1, 2))  # [e, n, d]
    dense_w = torch.zeros(n, e, dtype=x.dtype, device=x.device)
    dense_w.scatter_add_(1, idx, weights.to(x.dtype))
    return torch.bmm(dense_w.unsqueeze(1), y.transpose(0, 1)).squeeze(1)


def _use_dense(n: int, k: int, n_experts: int) -> bool:
    """Dense costs n_experts / k times the FLOPs of the routed GEMMs: worth it only for few
    experts, enough picks to touch a good share of them, and small batches."""
    return n_experts <= 8 * k and 4 * n * k >= n_experts and n <= 128


def moe_experts_torch(
    x: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    n, k = idx.shape
    if _use_dense(n, k, gate_up.shape[0]):
        return _moe_dense(x, idx, weights, gate_up, down, limit)
    if n * k <= 8:
        return _moe_few_tokens(x, idx, weights, gate_up, down, limit)
    order, counts = _group(idx, gate_up.shape[0])
    # Every pick's input row, grouped by expert, in one gather (index_select: see
    # kernels.gather); each expert then reads a contiguous slice.
    xs = x.index_select(0, order // k)
    w_sorted = weights.reshape(-1).index_select(0, order).to(x.dtype)[:, None]
    y_sorted = torch.empty(n * k, x.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        seg = slice(start, start + c)
        g, u = F.linear(xs[seg], gate_up[e]).chunk(2, dim=-1)
        act = clamped_swiglu(g, u, limit)
        torch.mul(F.linear(act, down[e]), w_sorted[seg], out=y_sorted[seg])
        start += c
    # Each pick's output added to its row in one pass (half the traffic of a copy back to the
    # pick order and a sum over the k picks).
    out = torch.zeros(n, x.shape[1], dtype=x.dtype, device=x.device)
    return out.index_add_(0, order // k, y_sorted)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _gate_up_kernel(
        x_ptr, rows_ptr, w_ptr, act_ptr, tile_e_ptr, tile_lo_ptr, tile_hi_ptr,
        D, INTER, limit, stride_x, stride_we, stride_wn, stride_act,
        PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        tile = tl.program_id(0)
        nb = tl.program_id(1)
        e = tl.load(tile_e_ptr + tile).to(tl.int64)
        lo = tl.load(tile_lo_ptr + tile)
        hi = tl.load(tile_hi_ptr + tile)
        m = lo + tl.arange(0, BLOCK_M)
        mmask = m < hi
        rows = tl.load(rows_ptr + m, mask=mmask, other=0).to(tl.int64)
        cols = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < INTER
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            kmask = kk < D
            a = tl.load(x_ptr + rows[:, None] * stride_x + kk[None, :],
                        mask=mmask[:, None] & kmask[None, :], other=0.0)  # fmt: skip
            wg = tl.load(w_ptr + e * stride_we + cols[None, :] * stride_wn + kk[:, None],
                         mask=cmask[None, :] & kmask[:, None], other=0.0)  # fmt: skip
            wu = tl.load(w_ptr + e * stride_we + (cols[None, :] + INTER) * stride_wn + kk[:, None],
                         mask=cmask[None, :] & kmask[:, None], other=0.0)  # fmt: skip
            acc_g += tl.dot(a, wg, input_precision=PREC)
            acc_u += tl.dot(a, wu, input_precision=PREC)
        g = tl.minimum(acc_g, limit)
        u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        act = g / (1.0 + tl.exp(-g)) * u
        out_mask = mmask[:, None] & cmask[None, :]
        out_ptrs = act_ptr + m[:, None] * stride_act + cols[None, :]
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _down_kernel(
        act_ptr, w_ptr, scale_ptr, y_ptr, tile_e_ptr, tile_lo_ptr, tile_hi_ptr,
        D, INTER, stride_act, stride_we, stride_wn, stride_y,
        PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        tile = tl.program_id(0)
        nb = tl.program_id(1)
        e = tl.load(tile_e_ptr + tile).to(tl.int64)
        lo = tl.load(tile_lo_ptr + tile)
        hi = tl.load(tile_hi_ptr + tile)
        m = lo + tl.arange(0, BLOCK_M)
        mmask = m < hi
        cols = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < D
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            kmask = kk < INTER
            a = tl.load(act_ptr + m[:, None] * stride_act + kk[None, :],
                        mask=mmask[:, None] & kmask[None, :], other=0.0)  # fmt: skip
            w = tl.load(w_ptr + e * stride_we + cols[None, :] * stride_wn + kk[:, None],
                        mask=cmask[None, :] & kmask[:, None], other=0.0)  # fmt: skip
            acc += tl.dot(a, w, input_precision=PREC)
        sc = tl.load(scale_ptr + m, mask=mmask, other=0.0).to(tl.float32)
        acc = acc * sc[:, None]
        tl.store(y_ptr + m[:, None] * stride_y + cols[None, :],
                 acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & cmask[None, :])  # fmt: skip


def moe_experts_triton(
    x: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    limit: float,
    block_m: int = 16,
    block_n: int = 32,
    block_k: int = 32,
) -> torch.Tensor:
    n, k = idx.shape
    d = x.shape[1]
    inter = down.shape[2]
    if x.stride(-1) != 1 or gate_up.stride(-1) != 1 or down.stride(-1) != 1:
        raise ValueError("moe inputs need a contiguous last dimension")
    order, counts = _group(idx, gate_up.shape[0])
    rows = (order // k).contiguous()
    w_sorted = weights.reshape(-1)[order].float().contiguous()
    tiles_e, tiles_lo, tiles_hi = [], [], []
    start = 0
    for e, c in enumerate(counts):
        for lo in range(start, start + c, block_m):
            tiles_e.append(e)
            tiles_lo.append(lo)
            tiles_hi.append(min(lo + block_m, start + c))
        start += c
    y_sorted = torch.empty(n * k, d, dtype=x.dtype, device=x.device)
    if tiles_e:
        dev = x.device
        te = torch.tensor(tiles_e, dtype=torch.int32, device=dev)
        tlo = torch.tensor(tiles_lo, dtype=torch.int32, device=dev)
        thi = torch.tensor(tiles_hi, dtype=torch.int32, device=dev)
        act = torch.empty(n * k, inter, dtype=x.dtype, device=dev)
        prec = "ieee" if x.dtype == torch.float32 else "tf32"
        _gate_up_kernel[(len(tiles_e), triton.cdiv(inter, block_n))](
            x, rows, gate_up, act, te, tlo, thi, d, inter, float(limit),
            x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
            PREC=prec, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        )  # fmt: skip
        _down_kernel[(len(tiles_e), triton.cdiv(d, block_n))](
            act, down, w_sorted, y_sorted, te, tlo, thi, d, inter,
            act.stride(0), down.stride(0), down.stride(1), y_sorted.stride(0),
            PREC=prec, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        )  # fmt: skip
    y = torch.empty_like(y_sorted)
    y[order] = y_sorted
    return y.view(n, k, -1).sum(1)


def moe_experts(
    x: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    fn = moe_experts_triton if use_triton(x) else moe_experts_torch
    return fn(x, idx, weights, gate_up, down, limit)


def moe_experts_mxfp4(
    x: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w: MoEWeights,
) -> torch.Tensor:
    """The routed experts with their weights kept in MXFP4 (w.gate_up / w.down packed bytes,
    w.gate_up_scale / w.down_scale their UE8M0 scales: model.moe.Experts.keep_quantised).

    A first version: a loop over the experts present, each running the rows routed to it
    through kernels.quant_gemm.mxfp4_linear (two launches per expert), the GEMM outputs cast
    to x's dtype as a plain layer's would be. A grouped kernel over all experts in one launch,
    like moe_experts_triton's, is the step after."""
    from deepring.kernels.quant_gemm import mxfp4_linear  # triton: only when kept

    n, k = idx.shape
    order, counts = _group(idx, w.gate_up.shape[0])
    rows = order // k
    w_sorted = weights.reshape(-1).index_select(0, order).to(x.dtype)[:, None]
    out = torch.zeros(n, x.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        seg = rows[start : start + c]
        h = mxfp4_linear(x.index_select(0, seg), w.gate_up[e], w.gate_up_scale[e]).to(x.dtype)
        g, u = h.chunk(2, dim=-1)
        act = clamped_swiglu(g, u, w.limit)
        y = mxfp4_linear(act, w.down[e], w.down_scale[e]).to(x.dtype)
        out.index_add_(0, seg, y * w_sorted[start : start + c])
        start += c
    return out


def routed_experts(
    x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w: MoEWeights
) -> torch.Tensor:
    """The routed experts' sum for rows x [T, D] routed to idx [T, k] with weights [T, k]:
    the kept-MXFP4 loop when the layer keeps its experts quantised, else moe_experts."""
    if w.gate_up_scale is not None:
        return moe_experts_mxfp4(x, idx, weights, w)
    return moe_experts(x, idx, weights, w.gate_up, w.down, w.limit)


class MoEWeights(NamedTuple):
    """One MoE layer's parameters, as the entry point takes them."""

    router: torch.Tensor  # [E, D]
    bias: torch.Tensor | None  # e_score_correction_bias (learned routing), [E]
    tid2eid: torch.Tensor | None  # hash routing: token -> expert ids, [vocab, k]
    func: str  # sqrtsoftplus | softmax | sigmoid
    top_k: int
    scaling: float  # routed_scaling_factor
    gate_up: torch.Tensor  # [E, 2I, D]
    down: torch.Tensor  # [E, D, I]
    limit: float  # swiglu_limit
    shared_gate: torch.Tensor  # the shared expert's [S, D], [S, D], [D, S]
    shared_up: torch.Tensor
    shared_down: torch.Tensor
    # Kept MXFP4 experts (model.moe.Experts.keep_quantised): gate_up / down are then packed
    # bytes [E, 2I, D/2] / [E, D, I/2] and these their UE8M0 scales [E, 2I, D/32] / [E, D, I/32].
    gate_up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None


def _score(logits: torch.Tensor, func: str) -> torch.Tensor:
    if func == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    if func == "softmax":
        return torch.softmax(logits, -1, dtype=torch.float32).to(logits.dtype)
    return torch.sigmoid(logits)


def route_torch(
    logits: torch.Tensor,
    func: str,
    bias: torch.Tensor | None,
    hashed_idx: torch.Tensor | None,
    top_k: int,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids [T, k] and weights [T, k] from router logits [T, E] (route_numba's reference)."""
    scores = _score(logits, func)
    if hashed_idx is not None:
        idx = hashed_idx.long()
    else:
        if bias is None:
            raise ValueError("learned routing needs the score correction bias")
        idx = torch.topk(scores + bias, top_k, dim=-1).indices
    w = scores.gather(1, idx)
    w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * scaling


def route(
    logits: torch.Tensor, input_ids: torch.Tensor, w: MoEWeights
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router after its GEMM: expert ids and weights [T, k] from logits [T, E]."""
    hashed = w.tid2eid[input_ids] if w.tid2eid is not None else None
    fn = route_numba if use_numba(logits) and logits.shape[0] else route_torch
    return fn(logits, w.func, w.bias, hashed, w.top_k, w.scaling)


def _numba_fits(w: MoEWeights) -> bool:
    """The numba MoE copies the gate / up projections: only for small layers, in inference,
    and plain (not kept quantised) weights."""
    g = w.gate_up
    if not (g.is_floating_point() and w.shared_gate.is_floating_point()):
        return False
    return not g.requires_grad and g.numel() * g.element_size() <= MOE_NUMBA_MAX_BYTES


def moe_layer(
    x: torch.Tensor,
    input_ids: torch.Tensor,
    w: MoEWeights,
    packed: MoEPacked,
    shared: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """An MoE layer on rows x [T, D]: routed experts plus the shared expert. `packed` is the
    layer's cache for the numba path; `shared` runs the shared expert on the other paths (the
    model fuses its GEMMs)."""
    if use_numba(x, MOE_NUMBA_ROWS) and _numba_fits(w):
        packed = packed.prepare(
            w.gate_up, w.down, w.shared_gate, w.shared_up, w.shared_down, w.limit, w.router
        )
        h = packed.project(x)  # every expert's gate / up, the shared one's, the router's
        idx, wts = route(h[:, packed.router_at :], input_ids, w)
        return moe_rows_numba(h, idx, wts, packed)
    idx, wts = route(F.linear(x, w.router), input_ids, w)
    return routed_experts(x, idx, wts, w) + shared(x)
