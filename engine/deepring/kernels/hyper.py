"""Hyper-connection mixes and merge (mHC): the torch reference, a numba CPU kernel, dispatch.

Before a sublayer the hc streams of a token are RMS-normalised together and projected to the
mix logits z (`mix`, the projection, is a GEMM the caller runs). From z come `pre` (sigmoid
+ eps: how the streams collapse into the sublayer input), `post` (2 sigmoid: how its output
spreads back) and `comb` (softmax rows + eps, then Sinkhorn-Knopp: doubly stochastic, how the
streams feed each other). After the sublayer, merge gives stream k = post_k * out +
sum_j comb_t[k, j] * h_j. All in fp32.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from deepring.kernels.dispatch import (
    cpu_kernel,
    cpu_parallel_kernel,
    prange,
    run_rows,
    serial_rows_limit,
    use_numba,
    weight_array,
)
from deepring.kernels.rmsnorm import inv_rms

# Up to this many rows, one fused norm beats normalising after the projection.
_FEW_ROWS = 64
# Up to this many rows the serial numba merge beats torch's (ad-hoc timing, 2 cores: 13 against
# 19 us at 32 rows, 54 against 34 us at 256); with its rows shared out among threads, at any
# size. The numba mixes win at any size (34 against 367 us at 32 rows, 2.3 against 3.5 ms at
# 4096).
_MERGE_NUMBA_ROWS = 64
# Rows per thread below which the numba kernels do not split their rows (dispatch.run_rows).
_PRE_ROWS_PER_THREAD = 16
_MERGE_ROWS_PER_THREAD = 16


def rms_mix(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.linear(rms_norm(streams flattened), weight) in fp32; h: [T, hc, D]."""
    flat = h.reshape(h.shape[0], h.shape[1] * h.shape[2]).float()
    if flat.shape[0] <= _FEW_ROWS:  # one fused norm beats the ops below for a few rows only
        return F.linear(F.rms_norm(flat, (flat.shape[1],), None, eps), weight)
    # The norm is one scale per row, so it can follow the (narrow) projection: one read of the
    # wide input for its norm instead of writing and re-reading a normalised copy.
    ms = torch.linalg.vector_norm(flat, dim=-1, keepdim=True).square_().div_(flat.shape[1])
    return F.linear(flat, weight).mul_(ms.add_(eps).rsqrt_())


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Alternate column / row normalisation of [T, n, n] positive matrices (column first),
    `iters` column passes in all. Laid out [n, n, T] inside so each sum is a pass over whole
    rows."""
    c = comb.permute(1, 2, 0).contiguous()  # [n, n, T]: c[i, j, t] = comb[t, i, j]
    n, _, t = c.shape
    rows = c.new_empty(n, 1, t)
    cols = c.new_empty(1, n, t)
    torch.sum(c, 0, keepdim=True, out=cols)
    c.div_(cols.add_(eps))
    for _ in range(iters - 1):
        torch.sum(c, 1, keepdim=True, out=rows)
        c.div_(rows.add_(eps))
        torch.sum(c, 0, keepdim=True, out=cols)
        c.div_(cols.add_(eps))
    # Contiguous [T, n, n]: bmm over a permuted view falls back to one small GEMM per row
    # (measured 11x slower at T=2048).
    return c.permute(2, 0, 1).contiguous()


def collapse(pre: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """sum_j pre_j * h_j in fp32, returned in h's dtype: [T, hc] x [T, hc, D] -> [T, D]."""
    if h.dtype == pre.dtype:  # one batched GEMM, no [T, hc, D] product in memory
        return torch.bmm(pre.unsqueeze(1), h).squeeze(1)
    return (pre.unsqueeze(-1) * h).sum(1).to(h.dtype)


def hc_pre_torch(
    h: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    iters: int,
    hc_eps: float,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h: [T, hc, D]; fn: [(2 + hc) hc, hc D]; base, scale: [(2 + hc) hc] (scale per mix).
    Returns post [T, hc], comb_t [T, hc, hc] (comb_t[k, j]: stream j into stream k) and the
    collapsed sublayer input [T, D] in h's dtype."""
    hc = h.shape[1]
    z = torch.addcmul(base, rms_mix(h, fn, norm_eps), scale)
    gates = torch.sigmoid(z[:, : 2 * hc])
    pre = gates[:, :hc] + hc_eps
    post = gates[:, hc:] * 2
    comb = torch.softmax(z[:, 2 * hc :].view(-1, hc, hc), -1) + hc_eps
    return post, sinkhorn(comb, iters, hc_eps).transpose(1, 2), collapse(pre, h)


@cpu_kernel
def _normalise(c, s, e, cols):
    """One Sinkhorn pass over c[i, j, t]: each row (cols=False) or column divided by its sum
    + e; s is scratch of length T."""
    hc, _, t_rows = c.shape
    for a in range(hc):
        s[:] = e
        for b in range(hc):
            i, j = (b, a) if cols else (a, b)
            for t in range(t_rows):
                s[t] += c[i, j, t]
        for b in range(hc):
            i, j = (b, a) if cols else (a, b)
            for t in range(t_rows):
                c[i, j, t] /= s[t]


@cpu_kernel
def _hc_pre_kernel(h, mix, base, scale, iters, hc_eps, norm_eps, post, comb_t, x):
    t_rows, hc, d = h.shape
    k = hc * d
    m = mix.shape[1]
    one = np.float32(1.0)
    e = np.float32(hc_eps)
    # z[o, t]: row axis innermost, so the per-mix loops below vectorise over tokens.
    z = np.empty((m, t_rows), np.float32)
    for t in range(t_rows):
        r = inv_rms(h[t].reshape(k), norm_eps)
        for o in range(m):
            z[o, t] = mix[t, o] * r * scale[o] + base[o]
    pre = np.empty((hc, t_rows), np.float32)
    for j in range(hc):
        for t in range(t_rows):
            pre[j, t] = one / (one + np.exp(-z[j, t])) + e
            post[t, j] = np.float32(2.0) / (one + np.exp(-z[hc + j, t]))
    c = z[2 * hc :].reshape(hc, hc, t_rows)  # c[i, j, t] = comb logits[t, i, j]
    s = np.empty(t_rows, np.float32)
    for i in range(hc):  # softmax over j, + eps
        mx = c[i, 0].copy()
        for j in range(1, hc):
            for t in range(t_rows):
                mx[t] = max(mx[t], c[i, j, t])
        s[:] = 0
        for j in range(hc):
            for t in range(t_rows):
                c[i, j, t] = np.exp(c[i, j, t] - mx[t])
                s[t] += c[i, j, t]
        for j in range(hc):
            for t in range(t_rows):
                c[i, j, t] = c[i, j, t] / s[t] + e
    for it in range(iters):  # Sinkhorn: columns first, then rows and columns alternately
        if it > 0:
            _normalise(c, s, e, False)
        _normalise(c, s, e, True)
    for t in range(t_rows):
        for a in range(hc):
            for j in range(hc):
                comb_t[t, a, j] = c[j, a, t]
        for i in range(d):
            x[t, i] = pre[0, t] * h[t, 0, i]
        for j in range(1, hc):
            p = pre[j, t]
            for i in range(d):
                x[t, i] += p * h[t, j, i]


@cpu_parallel_kernel
def _hc_pre_rows(h, mix, base, scale, iters, hc_eps, norm_eps, post, comb_t, x, parts):
    """_hc_pre_kernel on `parts` ranges of rows, in parallel."""
    n = h.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _hc_pre_kernel(h[a:b], mix[a:b], base, scale, iters, hc_eps, norm_eps, post[a:b],
                       comb_t[a:b], x[a:b])  # fmt: skip


def hc_pre_numba(
    h: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    iters: int,
    hc_eps: float,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_pre_torch for fp32 CPU tensors: the projection by torch, the rest in one kernel."""
    t, hc, d = h.shape
    h = h.contiguous()
    mix = F.linear(h.view(t, hc * d), fn)  # the norm is a per-row scale, applied in the kernel
    post = h.new_empty(t, hc)
    comb_t = h.new_empty(t, hc, hc)
    x = h.new_empty(t, d)
    run_rows(
        _hc_pre_kernel, _hc_pre_rows, _PRE_ROWS_PER_THREAD, h.numpy(), mix.numpy(),
        weight_array(base), weight_array(scale), iters, hc_eps, norm_eps, post.numpy(),
        comb_t.numpy(), x.numpy(),
    )  # fmt: skip
    return post, comb_t, x


def hc_pre(
    h: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    iters: int,
    hc_eps: float,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = hc_pre_numba if use_numba(h) and not fn.requires_grad else hc_pre_torch
    return impl(h, fn, base, scale, iters, hc_eps, norm_eps)


def hc_merge_torch(
    h: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb_t: torch.Tensor
) -> torch.Tensor:
    """New streams [T, hc, D]: stream k = post_k * out + sum_j comb_t[k, j] * h_j."""
    dt = h.dtype
    spread = (post if post.dtype == dt else post.to(dt)).unsqueeze(-1) * out.unsqueeze(1)
    # In place: no copy of spread.
    return spread.baddbmm_(comb_t if comb_t.dtype == dt else comb_t.to(dt), h)


@cpu_kernel
def _hc_merge_kernel(h, out, post, comb_t, new):
    t_rows, hc, d = h.shape
    for t in range(t_rows):
        for k in range(hc):
            p = post[t, k]
            for i in range(d):
                new[t, k, i] = p * out[t, i]
            for j in range(hc):
                c = comb_t[t, k, j]
                for i in range(d):
                    new[t, k, i] += c * h[t, j, i]


@cpu_parallel_kernel
def _hc_merge_rows(h, out, post, comb_t, new, parts):
    """_hc_merge_kernel on `parts` ranges of rows, in parallel."""
    n = h.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _hc_merge_kernel(h[a:b], out[a:b], post[a:b], comb_t[a:b], new[a:b])


def hc_merge_numba(
    h: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb_t: torch.Tensor
) -> torch.Tensor:
    h, out, post, comb_t = (a.contiguous() for a in (h, out, post, comb_t))
    new = torch.empty_like(h)
    run_rows(_hc_merge_kernel, _hc_merge_rows, _MERGE_ROWS_PER_THREAD, h.numpy(), out.numpy(),
             post.numpy(), comb_t.numpy(), new.numpy())  # fmt: skip
    return new


def hc_merge(
    h: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb_t: torch.Tensor
) -> torch.Tensor:
    same = out.dtype == post.dtype == comb_t.dtype
    fast = use_numba(h, serial_rows_limit(_MERGE_NUMBA_ROWS)) and same and not out.requires_grad
    impl = hc_merge_numba if fast else hc_merge_torch
    return impl(h, out, post, comb_t)
