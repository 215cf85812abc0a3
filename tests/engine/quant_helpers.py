"""Quantisers of DeepSeek's official checkpoint formats, written from the format description
(not the engine's dequantiser): FP8 e4m3 with power-of-two UE8M0 block scales, MXFP4 (E2M1
pairs per byte, low nibble first, a UE8M0 scale per 32 inputs). Each returns the stored
tensors and the fp32 values they stand for."""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _pow2_exponent(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The smallest power-of-two exponent e with amax / 2^e <= top (0 for all-zero blocks)."""
    e = torch.ceil(torch.log2(amax.clamp(min=1e-30) / top))
    return torch.where(amax > 0, e, torch.zeros_like(e)).clamp(-127, 127)


def quantize_fp8(w: torch.Tensor, block: int = 128):
    """-> (fp8 weight, e8m0 scale grid, dequantised fp32 reference)."""
    out, inp = w.shape
    go, gi = -(-out // block), -(-inp // block)
    padded = torch.zeros(go * block, gi * block)
    padded[:out, :inp] = w
    amax = padded.view(go, block, gi, block).abs().amax(dim=(1, 3))
    e = _pow2_exponent(amax, E4M3_MAX)
    full = torch.exp2(e).repeat_interleave(block, 0)[:out].repeat_interleave(block, 1)[:, :inp]
    q = (w / full).to(torch.float8_e4m3fn)
    scale = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return q, scale, q.float() * full


def quantize_mxfp4(w: torch.Tensor, group: int = 32):
    """-> (packed uint8 [out, in/2], e8m0 scales [out, in/group], dequantised reference)."""
    out, inp = w.shape
    amax = w.view(out, inp // group, group).abs().amax(-1)
    e = _pow2_exponent(amax, 6.0)
    full = torch.exp2(e).repeat_interleave(group, 1)
    v = w / full
    mag = (v.abs().unsqueeze(-1) - E2M1_MAGNITUDES).abs().argmin(-1)
    codes = mag + 8 * (v < 0).long()
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    ref = torch.where(v < 0, -1.0, 1.0) * E2M1_MAGNITUDES[mag] * full
    scale = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return packed, scale, ref
