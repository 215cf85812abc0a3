"""Routed-expert GEMMs: clamped SwiGLU experts applied to each token's top-k picks.

gate_up: [E, 2I, D] (gate rows first, then up rows); down: [E, D, I]. For a token x routed to
expert e with weight w: w * down_e(silu(min(g, limit)) * clamp(u, -limit, limit)), [g; u] =
gate_up_e x. Assignments are grouped by expert (one GEMM per expert); the k contributions of a
token are summed in a fixed order, so the result does not depend on the other tokens present.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from deepring.kernels.dispatch import (
    HAVE_TRITON,
    cpu_kernel,
    cpu_parallel_kernel,
    prange,
    run_rows,
    use_triton,
    weight_array,
)


@cpu_kernel
def _route_kernel(logits, func, bias, hashed, idx, w, scaling):
    """The router after its GEMM, per token: scores, the top-k of score + bias (unless the
    hash table chose idx), and the chosen scores renormalised x scaling."""
    t_rows, n_exp = logits.shape
    k = idx.shape[1]
    one = np.float32(1.0)
    scores = np.empty(n_exp, np.float32)
    key = np.empty(n_exp, np.float32)
    for t in range(t_rows):
        if func == 1:  # softmax (see _FUNC_CODES)
            m = logits[t].max()
            s = np.float32(0.0)
            for e in range(n_exp):
                scores[e] = np.exp(logits[t, e] - m)
                s += scores[e]
            for e in range(n_exp):
                scores[e] /= s
        else:
            for e in range(n_exp):
                x = logits[t, e]
                if func == 0:  # sqrt(softplus), softplus linear above 20 as torch's
                    scores[e] = np.sqrt(x if x > 20 else np.log1p(np.exp(x)))
                else:
                    scores[e] = one / (one + np.exp(-x))
        if not hashed:  # top-k by repeated maximum: k is small (6 for V4)
            for e in range(n_exp):
                key[e] = scores[e] + bias[e]
            for j in range(k):
                best = 0
                for e in range(1, n_exp):
                    if key[e] > key[best]:
                        best = e
                idx[t, j] = best
                key[best] = -np.inf
        s = np.float32(0.0)
        for j in range(k):
            if idx[t, j] < 0 or idx[t, j] >= n_exp:
                raise IndexError("router: expert id out of range")
            s += scores[idx[t, j]]
        for j in range(k):
            w[t, j] = scores[idx[t, j]] / (s + np.float32(1e-20)) * scaling


# The router's scoring functions, as the kernel numbers them.
_FUNC_CODES = {"sqrtsoftplus": 0, "softmax": 1, "sigmoid": 2}
_NO_BIAS = np.zeros(1, np.float32)


def route_numba(
    logits: torch.Tensor,
    func: str,
    bias: torch.Tensor | None,
    hashed_idx: torch.Tensor | None,
    top_k: int,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids [T, k] and weights [T, k] from router logits [T, E] (fp32 CPU): the top-k of
    score + bias, or the hash table's picks `hashed_idx` when given."""
    t = logits.shape[0]
    if hashed_idx is not None:
        idx = hashed_idx.long().contiguous()
    else:
        idx = torch.empty(t, top_k, dtype=torch.long)
    w = torch.empty(t, top_k)
    _route_kernel(
        logits.contiguous().numpy(), _FUNC_CODES[func],
        _NO_BIAS if bias is None else weight_array(bias), hashed_idx is not None,
        idx.numpy(), w.numpy(), scaling,
    )  # fmt: skip
    return idx, w


# Up to this many rows the numba MoE (moe_rows_numba) runs instead of the torch path, and only
# for layers whose expert weights are small (it keeps a copy of the gate / up projections).
MOE_NUMBA_ROWS = 64
# Rows per thread below which the rows kernel does not split its rows (dispatch.run_rows).
_ROWS_PER_THREAD = 4
MOE_NUMBA_MAX_BYTES = 64 << 20


@cpu_kernel
def _down_into(h, g0, inter, limit, scale, down, act, out):
    """out += scale * down @ swiglu(g, u), g = h[g0 : g0 + inter], u the next inter values."""
    for j in range(inter):
        g = min(h[g0 + j], limit)
        u = min(max(h[g0 + inter + j], -limit), limit)
        act[j] = scale * (g / (np.float32(1.0) + np.exp(-g))) * u
    for c in range(down.shape[0]):
        s = np.float32(0.0)
        for j in range(inter):
            s += down[c, j] * act[j]
        out[c] += s


@cpu_kernel
def _check_expert_ids(idx, n_experts):
    for t in range(idx.shape[0]):
        for r in range(idx.shape[1]):
            if idx[t, r] < 0 or idx[t, r] >= n_experts:
                raise IndexError("moe: an expert id is out of range")


@cpu_kernel
def _moe_rows_kernel(h, idx, wts, down, shared_down, limit, out):
    """out[t] = shared(t) + sum_r wts[t, r] * expert_{idx[t, r]}(t), from the gate / up
    projections h [n, E * 2i + 2s] of every expert and then the shared one."""
    n, d = out.shape
    n_experts, _, inter = down.shape
    s_inter = shared_down.shape[1]
    _check_expert_ids(idx, n_experts)
    act = np.empty(max(inter, s_inter), np.float32)
    lim = np.float32(limit)
    for t in range(n):
        for c in range(d):
            out[t, c] = 0.0
        _down_into(h[t], n_experts * 2 * inter, s_inter, lim, np.float32(1.0), shared_down, act,
                   out[t])  # fmt: skip
        for r in range(idx.shape[1]):
            e = idx[t, r]
            _down_into(h[t], e * 2 * inter, inter, lim, wts[t, r], down[e], act, out[t])


@cpu_parallel_kernel
def _moe_rows_parallel(h, idx, wts, down, shared_down, limit, out, parts):
    """_moe_rows_kernel on `parts` ranges of rows, in parallel. The expert ids are checked
    first, here: an exception is not raised out of a parallel loop."""
    _check_expert_ids(idx, down.shape[0])
    n = h.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _moe_rows_kernel(h[a:b], idx[a:b], wts[a:b], down, shared_down, limit, out[a:b])


def moe_rows_numba(
    h: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, packed: MoEPacked
) -> torch.Tensor:
    """Routed experts plus the shared expert for a few rows (decode) on fp32 CPU tensors, from
    packed.project(x) (the gate / up projections of every expert in one GEMM: few rows, cheaper
    than picking): one kernel for the chosen experts' activations and down projections, where
    the torch path runs about a dozen ops."""
    if h.dim() != 2 or h.shape[1] != packed.gate_up.shape[0] or not h.is_contiguous():
        raise ValueError(f"moe: {tuple(h.shape)} is not packed.project's output")
    if idx.shape != weights.shape or idx.shape[0] != h.shape[0]:
        raise ValueError(f"moe: idx {tuple(idx.shape)} and weights {tuple(weights.shape)} differ")
    out = h.new_empty(h.shape[0], packed.dim)
    run_rows(
        _moe_rows_kernel, _moe_rows_parallel, _ROWS_PER_THREAD, h.numpy(),
        idx.contiguous().numpy(), weights.float().contiguous().numpy(), packed.down,
        packed.shared_down, packed.limit, out.numpy(),
    )  # fmt: skip
    return out


class MoEPacked:
    """An MoE layer's weights as moe_rows_numba takes them: the gate / up projections of every
    routed expert, then the shared one's, then the router (when given) as one matrix
    [E * 2i + 2s (+ E), d] (a copy), the down projections as numpy views. Rebuilt when a weight
    changes."""

    def __init__(self) -> None:
        self._key: tuple | None = None

    def prepare(
        self,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        shared_gate: torch.Tensor,
        shared_up: torch.Tensor,
        shared_down: torch.Tensor,
        limit: float,
        router: torch.Tensor | None = None,
    ) -> MoEPacked:
        extra = [] if router is None else [router]
        ws = (gate_up, down, shared_gate, shared_up, shared_down, *extra)
        key = (*((w.data_ptr(), w._version) for w in ws), limit)
        if key != self._key:
            e, i2, d = gate_up.shape
            shapes = {
                "down": (down.shape, (e, d, i2 // 2)),
                "shared_up": (shared_up.shape, shared_gate.shape),
                "shared_gate": (shared_gate.shape[1:], (d,)),
                "shared_down": (shared_down.shape, (d, shared_gate.shape[0])),
            }
            if router is not None:
                shapes["router"] = (router.shape, (e, d))
            for name, (got, want) in shapes.items():
                if tuple(got) != tuple(want):
                    raise ValueError(f"moe: {name} has shape {tuple(got)}, expected {want}")
            self.dim = d
            with torch.no_grad():
                self.gate_up = torch.cat(
                    [gate_up.reshape(e * i2, d), shared_gate, shared_up, *extra]
                ).float()
            self.router_at = e * i2 + 2 * shared_gate.shape[0]
            self.down = weight_array(down)
            self.shared_down = weight_array(shared_down)
            self.limit = float(limit)
            self._key = key
        return self

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Every projection of x the packed matrix holds, [T, E * 2i + 2s (+ E)]."""
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"moe: rows {tuple(x.shape)} do not match the expert width {self.dim}")
        return F.linear(x, self.gate_up)


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
