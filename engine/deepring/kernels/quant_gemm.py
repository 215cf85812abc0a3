"""GEMMs over DeepSeek's quantised weights without dequantising them in memory (Triton).

- `fp8_block_linear(x, w, scale, block)`: w FP8 e4m3 [N, K] (its bytes, uint8, or
  float8_e4m3fn) with one UE8M0 scale per block x block tile (exponent bytes, uint8
  [ceil(N/block), ceil(K/block)]); y = x @ (w * 2^(scale - 127)).T.
- `mxfp4_linear(x, w, scale)`: w MXFP4 [N, K/2] (two E2M1 codes per byte, the lower index in
  the low nibble) with one UE8M0 scale per 32 inputs (uint8 [N, K/32]).

Each weight tile is decoded in registers right after its load and multiplied in fp32, so the
weights stay 1 byte (FP8) or half a byte (FP4) per value in device memory: what lets
V4-Flash's experts fit at all. The checkpoint layout is the one model/quant.py reads; a model
loaded with its quantised weights kept (model.loader: the default on CUDA) runs its dense
linears (model.linear.Linear) through `quant_matmul` and its routed experts through
kernels.moe.moe_experts_mxfp4. Tests run them under TRITON_INTERPRET=1 against weights
dequantised by the tests' own quantisers, and a whole kept model against its dequantised twin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MXFP4_GROUP = 32
# Tile sizes: tl.dot needs >= 16 on each side; BLOCK_K divides every FP8 block edge in use
# (32 for V4.1-Flash, 128 for V4) and is a multiple of the MXFP4 group.
BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 32


@triton.jit
def _x_tile(x_ptr, rm, rk, M, K, stride_xm):
    """The activations' [BM, BK] tile in fp32 (zeros past the edges)."""
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    return tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=mask, other=0.0).to(
        tl.float32
    )


@triton.jit
def _e8m0(raw):
    return tl.exp2(raw.to(tl.float32) - 127.0)


@triton.jit
def _e2m1(code):
    """E2M1 code (4 bits: sign, 2 exponent bits, 1 mantissa bit) -> fp32."""
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * tl.exp2((e - 1).to(tl.float32)))
    return tl.where(((code >> 3) & 1) == 1, -mag, mag)


@triton.jit
def _w_tile(w_ptr, s_ptr, rn, rk, N, K, stride_wn, stride_sn, QB: tl.constexpr,
            FP4: tl.constexpr):  # fmt: skip
    """The weight's [BN, BK] tile decoded to fp32 (zeros past the edges). FP8: one byte per
    value, one scale per QB x QB tile. FP4 (MXFP4): each byte holds inputs 2j (low nibble) and
    2j + 1 (high), loaded per input with that input's half shifted out; one scale per QB
    inputs of a row."""
    wm = (rn[:, None] < N) & (rk[None, :] < K)
    if FP4:
        raw = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :] // 2, mask=wm, other=0)
        w = _e2m1((raw.to(tl.int32) >> ((rk[None, :] % 2) * 4)) & 0xF)
        s = tl.load(s_ptr + rn[:, None] * stride_sn + rk[None, :] // QB, mask=wm, other=127)
    else:
        raw = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=wm, other=0)
        w = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        s = tl.load(s_ptr + (rn[:, None] // QB) * stride_sn + rk[None, :] // QB, mask=wm, other=127)
    return w * _e8m0(s)


@triton.jit
def _quant_linear_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
    QB: tl.constexpr, FP4: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = _x_tile(x_ptr, rm, rk, M, K, stride_xm)
        w = _w_tile(w_ptr, s_ptr, rn, rk, N, K, stride_wn, stride_sn, QB, FP4)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))  # fmt: skip


def _bytes(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.int8):
        t = t.view(torch.uint8)
    if t.dtype != torch.uint8:
        raise ValueError(f"{name} must hold bytes (uint8 or an 8-bit float), got {t.dtype}")
    return t.contiguous()


def _launch(x, w, scale, n, k, qb: int, fp4: bool) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [M, {k}], got {tuple(x.shape)}")
    x = x.contiguous()
    out = torch.empty(x.shape[0], n, dtype=torch.float32, device=x.device)
    if x.shape[0] == 0:  # no rows (an expert no token picked, an empty step): no launch
        return out
    grid = (triton.cdiv(x.shape[0], BLOCK_M), triton.cdiv(n, BLOCK_N))
    _quant_linear_kernel[grid](
        x, w, scale, out, x.shape[0], n, k, x.stride(0), w.stride(0), scale.stride(0),
        out.stride(0), qb, fp4, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
    )  # fmt: skip
    return out


def fp8_block_linear(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, block: int
) -> torch.Tensor:
    """x [M, K] @ dequant(w [N, K], scale).T -> [M, N] fp32 (see the module docstring)."""
    w, scale = _bytes(w, "the FP8 weight"), _bytes(scale, "the UE8M0 scale")
    n, k = w.shape
    grid = (-(-n // block), -(-k // block))
    if tuple(scale.shape) != grid:
        raise ValueError(
            f"a {n}x{k} FP8 weight needs a {grid} scale grid, got {tuple(scale.shape)}"
        )
    if block % BLOCK_K:
        raise ValueError(f"the FP8 block edge must be a multiple of {BLOCK_K}, got {block}")
    return _launch(x, w, scale, n, k, block, fp4=False)


def mxfp4_linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ dequant(w [N, K/2], scale [N, K/32]).T -> [M, N] fp32."""
    w, scale = _bytes(w, "the MXFP4 weight"), _bytes(scale, "the UE8M0 scale")
    n, k = w.shape[0], 2 * w.shape[1]
    if k % MXFP4_GROUP or tuple(scale.shape) != (n, k // MXFP4_GROUP):
        raise ValueError(
            f"an MXFP4 weight of {n}x{k} values needs a scale of shape {(n, k // MXFP4_GROUP)}, "
            f"got {tuple(scale.shape)}"
        )
    return _launch(x, w, scale, n, k, MXFP4_GROUP, fp4=True)


def quant_matmul(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, fmt: str, block: int
) -> torch.Tensor:
    """x [..., K] through a kept linear layer (model.linear.Linear): [..., N] in x's dtype (the
    kernels accumulate and return fp32; the layer's output is what a plain layer's would be)."""
    flat = x.reshape(-1, x.shape[-1])
    if fmt == "fp8":
        y = fp8_block_linear(flat, w, scale, block)
    elif fmt == "mxfp4":
        y = mxfp4_linear(flat, w, scale)
    else:
        raise ValueError(f"unknown quantised format {fmt!r}")
    return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])
