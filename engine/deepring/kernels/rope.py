"""Interleaved RoPE on the trailing `rope_dim` channels of each head (V4's [nope | rope] layout).

`inverse=True` rotates by the negative angle: V4 applies it to the attention output, because K=V
carried the key's rotation into the values.
"""

from __future__ import annotations

import numpy as np
import torch

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
from deepring.kernels.rmsnorm import NO_WEIGHT, NUMBA_ROWS, ROWS_PER_THREAD, inv_rms, rms_norm


def apply_rope_torch(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    """x: [T, ..., D]; cos, sin: [T, R/2] (fp32). Returns a new tensor.

    Each channel pair (2i, 2i+1) is a complex number rotated by exp(+-i*angle).
    """
    r = cos.shape[-1] * 2
    cis = rope_cis(cos, sin, inverse, x.dim())
    seg = x[..., x.shape[-1] - r :].float()
    if not _pair_aligned(seg):
        seg = seg.contiguous()
    rot = torch.view_as_complex(seg.unflatten(-1, (-1, 2)))
    out = x.clone()
    out[..., x.shape[-1] - r :] = torch.view_as_real(rot * cis).flatten(-2)
    return out


def _pair_aligned(seg: torch.Tensor) -> bool:
    """Whether view_as_complex can view seg's channel pairs (even offset and strides)."""
    return not (seg.storage_offset() % 2 or any(st % 2 for st in seg.stride()[:-1]))


def rope_cis(cos: torch.Tensor, sin: torch.Tensor, inverse: bool, dim: int) -> torch.Tensor:
    """The rotations exp(+-i*angle) as complex64, shaped to broadcast over x of `dim` dims."""
    return broadcast_cis(torch.complex(cos.float(), -sin.float() if inverse else sin.float()), dim)


def broadcast_cis(cis: torch.Tensor, dim: int) -> torch.Tensor:
    """Rotations [T, R/2] viewed to broadcast over x [T, ..., D] of `dim` dims."""
    return cis.view((cis.shape[0],) + (1,) * (dim - 2) + (cis.shape[-1],))


@cpu_kernel
def _rotate_pairs(v, cos, sin, sign):
    """(a + ib)(cos + i sign sin), in place, on the trailing channel pairs of one head row v."""
    half = cos.shape[0]
    nope = v.shape[0] - 2 * half
    for p in range(half):
        a = v[nope + 2 * p]
        b = v[nope + 2 * p + 1]
        c = cos[p]
        s = sign * sin[p]
        v[nope + 2 * p] = a * c - b * s
        v[nope + 2 * p + 1] = b * c + a * s


@cpu_kernel
def _norm_rope_kernel(x, weight, has_weight, eps, cos, sin, out):
    t_rows, heads, d = x.shape
    for t in range(t_rows):
        for h in range(heads):
            inv = inv_rms(x[t, h], eps)
            for i in range(d):
                out[t, h, i] = x[t, h, i] * inv * (weight[i] if has_weight else np.float32(1.0))
            _rotate_pairs(out[t, h], cos[t], sin[t], np.float32(1.0))


@cpu_parallel_kernel
def _norm_rope_rows(x, weight, has_weight, eps, cos, sin, out, parts):
    """_norm_rope_kernel on `parts` ranges of rows, in parallel."""
    n = x.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _norm_rope_kernel(x[a:b], weight, has_weight, eps, cos[a:b], sin[a:b], out[a:b])


def norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cis: torch.Tensor | None = None,
) -> torch.Tensor:
    """apply_rope(rms_norm(x, weight, eps), cos, sin) over x [T, ..., D] (a new tensor); `cis`
    as for apply_rope. One numba kernel call on CPU instead of the norm and the rotation's
    four ops."""
    if use_numba(x, serial_rows_limit(NUMBA_ROWS)) and cos.dtype == torch.float32:
        t, d = x.shape[0], x.shape[-1]
        x3 = x.contiguous().view(t, -1, d)
        out = torch.empty_like(x3)
        w = NO_WEIGHT if weight is None else weight_array(weight)
        run_rows(_norm_rope_kernel, _norm_rope_rows, ROWS_PER_THREAD, x3.numpy(), w,
                 weight is not None, eps, cos.numpy(), sin.numpy(), out.numpy())  # fmt: skip
        return out.view(x.shape)
    return apply_rope(rms_norm(x, weight, eps), cos, sin, inplace=True, cis=cis)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_kernel(
        x_ptr, y_ptr, cos_ptr, sin_ptr, H, D, NOPE, stride_xt, stride_xh, stride_yt, stride_yh,
        stride_c, SIGN: tl.constexpr, HALF: tl.constexpr, BLOCK_NOPE: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        xrow = x_ptr + t * stride_xt + h * stride_xh
        yrow = y_ptr + t * stride_yt + h * stride_yh
        for start in range(0, NOPE, BLOCK_NOPE):
            cols = start + tl.arange(0, BLOCK_NOPE)
            m = cols < NOPE
            tl.store(yrow + cols, tl.load(xrow + cols, mask=m), mask=m)
        i = tl.arange(0, HALF)
        c = tl.load(cos_ptr + t * stride_c + i)
        s = tl.load(sin_ptr + t * stride_c + i) * SIGN
        x0 = tl.load(xrow + NOPE + 2 * i).to(tl.float32)
        x1 = tl.load(xrow + NOPE + 2 * i + 1).to(tl.float32)
        tl.store(yrow + NOPE + 2 * i, (x0 * c - x1 * s).to(y_ptr.dtype.element_ty))
        tl.store(yrow + NOPE + 2 * i + 1, (x1 * c + x0 * s).to(y_ptr.dtype.element_ty))


def apply_rope_triton(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    half = cos.shape[-1]
    if half & (half - 1):
        raise ValueError(f"rope kernel needs a power-of-two rope dim, got {2 * half}")
    t, d = x.shape[0], x.shape[-1]
    x3 = x.reshape(t, -1, d)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    y = torch.empty_like(x3)
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    nope = d - 2 * half
    if t and x3.shape[1]:
        _rope_kernel[(t, x3.shape[1])](
            x3, y, cos, sin, x3.shape[1], d, nope, x3.stride(0), x3.stride(1), y.stride(0),
            y.stride(1), cos.stride(0), SIGN=-1.0 if inverse else 1.0, HALF=half,
            BLOCK_NOPE=min(max(next_pow2(nope), 16), 1024),
        )  # fmt: skip
    return y.view(x.shape)


def _rotate_in_place(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool, cis: torch.Tensor | None
) -> torch.Tensor | None:
    """Rotate x's rope channels in place through a complex view (x fp32, pair-aligned), or None
    where x does not allow it. A third of the torch ops of the copying path: a decode step of a
    small model calls RoPE a dozen times, and each op costs more than its arithmetic."""
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        return None
    seg = x[..., x.shape[-1] - 2 * cos.shape[-1] :]
    if not _pair_aligned(seg):
        return None
    if cis is None:
        cis = rope_cis(cos, sin, inverse, x.dim())
    torch.view_as_complex(seg.unflatten(-1, (-1, 2))).mul_(cis)
    return x


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    inverse: bool = False,
    inplace: bool = False,
    cis: torch.Tensor | None = None,
) -> torch.Tensor:
    """`inplace=True`: x is the caller's to overwrite (a fresh projection or output); the torch
    path then rotates it in place where it can, with `cis` = rope_cis(cos, sin, inverse,
    x.dim()) if the caller has it. The result is the same either way."""
    if use_triton(x):
        return apply_rope_triton(x, cos, sin, inverse)
    fast = use_numba(x, serial_rows_limit(NUMBA_ROWS)) and cos.dtype == torch.float32
    if inplace and fast and x.is_contiguous():
        t, d = x.shape[0], x.shape[-1]
        run_rows(_rope_in_place_kernel, _rope_in_place_rows, ROWS_PER_THREAD,
                 x.view(t, -1, d).numpy(), cos.numpy(), sin.numpy(), inverse)  # fmt: skip
        return x
    if inplace and (done := _rotate_in_place(x, cos, sin, inverse, cis)) is not None:
        return done
    return apply_rope_torch(x, cos, sin, inverse)


@cpu_kernel
def _rope_in_place_kernel(x, cos, sin, inverse):
    """Rotate the trailing channel pairs of x [T, H, D] by exp(+-i angle), in place."""
    sign = np.float32(-1.0) if inverse else np.float32(1.0)
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            _rotate_pairs(x[t, h], cos[t], sin[t], sign)


@cpu_parallel_kernel
def _rope_in_place_rows(x, cos, sin, inverse, parts):
    """_rope_in_place_kernel on `parts` ranges of rows, in parallel."""
    n = x.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _rope_in_place_kernel(x[a:b], cos[a:b], sin[a:b], inverse)
