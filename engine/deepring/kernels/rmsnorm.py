"""RMSNorm over the last dimension, optionally weighted (weights are kept in fp32).

Statistics and the weight multiply run in fp32; the result is cast back to the input dtype once.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from deepring.kernels.dispatch import (
    HAVE_TRITON,
    cpu_kernel,
    cpu_parallel_kernel,
    next_pow2,
    prange,
    run_rows,
    serial_rows_limit,
    use_numba,
    use_triton,
    weight_array,
)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32 and x.numel() <= 64 * x.shape[-1]:
        # A few rows (decode): torch's fused op costs one dispatch instead of five.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    # Many rows: one pass for the norms (no squared copy), one for the scaling, and the weight
    # multiplied in place.
    ms = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1])
    y = xf * ms.add_(eps).rsqrt_()
    if weight is not None:
        y.mul_(weight.float())
    return y.to(x.dtype)


@cpu_kernel
def inv_rms(row, eps):
    """1 / sqrt(mean(row^2) + eps) of a 1-D fp32 row: the RMSNorm scale, for numba kernels."""
    ss = np.float32(0.0)
    for i in range(row.shape[0]):
        ss += row[i] * row[i]
    return np.float32(1.0) / np.sqrt(ss / np.float32(row.shape[0]) + np.float32(eps))


@cpu_kernel
def _rms_norm_numba(x, weight, has_weight, eps, out):
    n, d = x.shape
    for r in range(n):
        inv = inv_rms(x[r], eps)
        if has_weight:
            for i in range(d):
                out[r, i] = x[r, i] * inv * weight[i]
        else:
            for i in range(d):
                out[r, i] = x[r, i] * inv


@cpu_parallel_kernel
def _rms_norm_rows(x, weight, has_weight, eps, out, parts):
    """_rms_norm_numba on `parts` ranges of rows, in parallel."""
    n = x.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _rms_norm_numba(x[a:b], weight, has_weight, eps, out[a:b])


def rms_norm_numba(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """rms_norm_torch for fp32 CPU tensors in one kernel call."""
    flat = x.contiguous().view(-1, x.shape[-1])
    out = torch.empty_like(flat)
    w = NO_WEIGHT if weight is None else weight_array(weight)
    run_rows(_rms_norm_numba, _rms_norm_rows, ROWS_PER_THREAD, flat.numpy(), w,
             weight is not None, eps, out.numpy())  # fmt: skip
    return out.view(x.shape)


# Stands in for an absent weight (numba needs an array of one type either way).
NO_WEIGHT = np.ones(1, np.float32)
# Up to this many tokens the serial numba kernel beats torch's (ad-hoc timing on 2 cores: 11
# against 20 us for 32 x 128, 43 against 88 us for 1024 x 128); with its rows shared out among
# threads, at any size.
NUMBA_ROWS = 1024
# Rows per thread below which the norm kernels do not split their rows (dispatch.run_rows).
ROWS_PER_THREAD = 64


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, w_ptr, y_ptr, D, stride_x, stride_y, eps,
        HAS_W: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, D, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            v = tl.load(x_ptr + row * stride_x + cols, mask=cols < D, other=0.0).to(tl.float32)
            acc += v * v
        inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)
        for start in range(0, D, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            m = cols < D
            v = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32) * inv
            if HAS_W:
                v = v * tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
            tl.store(y_ptr + row * stride_y + cols, v.to(y_ptr.dtype.element_ty), mask=m)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    d = x2.shape[1]
    if weight is not None and weight.shape != (d,):
        raise ValueError(f"rms_norm weight shape {tuple(weight.shape)} != ({d},)")
    y = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, weight if weight is not None else x2, y, d, x2.stride(0), y.stride(0), float(eps),
            HAS_W=weight is not None, BLOCK=min(next_pow2(d), 4096),
        )  # fmt: skip
    return y.view(shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if use_triton(x):
        return rms_norm_triton(x, weight, eps)
    if use_numba(x, serial_rows_limit(NUMBA_ROWS)):
        return rms_norm_numba(x, weight, eps)
    return rms_norm_torch(x, weight, eps)
