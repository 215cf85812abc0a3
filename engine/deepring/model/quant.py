"""Quantised checkpoint formats of DeepSeek V4: checked, then dequantised at load or kept.

- FP8 dense weights: `X.weight` float8_e4m3fn [out, in] with `X.scale`, one UE8M0 scale per
  128x128 block (float8_e8m0fnu, or its raw exponent bytes as uint8) [ceil(out/128),
  ceil(in/128)]; value = fp8 x 2^(byte - 127). DeepSeek V3's spelling, `X.weight_scale_inv`
  in fp32, is read the same way.
- MXFP4 routed experts: `X.weight` [out, in/2] holding two E2M1 codes per byte (the element
  with the lower index in the low nibble, as torch's float4_e2m1fn_x2; int8 / uint8 bytes are
  accepted too) with `X.scale`, one UE8M0 scale per 32 consecutive inputs [out, in/32].

A weight and its scale may come in either order and from different shards: `QuantPairs` holds
whichever arrives first until its partner does. Every scale is checked against its weight's
shape (the grid it implies) and for the UE8M0 NaN code (0xFF); an unpaired weight or scale at
the end of the checkpoint is an error naming it. A pair whose weight the model keeps quantised
(`keep`: model.weights.keep_quantised laid the module out for it) passes through as raw bytes,
checked the same way, for kernels.quant_gemm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

FP8_BLOCK = 128
MXFP4_GROUP = 32
_E8M0_NAN = 255
# E2M1 code -> value: sign bit 3, exponent bits 2-1, mantissa bit 0.
_E2M1 = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)
_FP4_PACKED = (torch.float4_e2m1fn_x2, torch.uint8, torch.int8)
_SCALE_SUFFIXES = (".scale", ".weight_scale_inv")


def e8m0_bytes(scale: torch.Tensor, name: str) -> torch.Tensor:
    """UE8M0 scales (float8_e8m0fnu or exponent bytes) -> their exponent bytes (uint8),
    checked for dtype and the NaN code."""
    if scale.dtype == torch.float8_e8m0fnu:
        raw = scale.view(torch.uint8)
    elif scale.dtype == torch.uint8:
        raw = scale
    else:
        raise ValueError(f"scale {name!r} has dtype {scale.dtype}, expected UE8M0 (float8_e8m0fnu)")
    if bool((raw == _E8M0_NAN).any()):
        raise ValueError(f"scale {name!r} holds the UE8M0 NaN code 0xFF")
    return raw


def e8m0_values(scale: torch.Tensor, name: str) -> torch.Tensor:
    """UE8M0 scales (float8_e8m0fnu or exponent bytes) -> fp32 powers of two."""
    return torch.exp2(e8m0_bytes(scale, name).to(torch.float32) - 127.0)


def _scale_values(scale: torch.Tensor, name: str) -> torch.Tensor:
    if scale.dtype == torch.float32:  # weight_scale_inv: a plain fp32 multiplier
        if not bool(torch.isfinite(scale).all()) or bool((scale <= 0).any()):
            raise ValueError(f"scale {name!r} has non-finite or non-positive entries")
        return scale
    return e8m0_values(scale, name)


def check_fp8(weight: torch.Tensor, scale: torch.Tensor, name: str, block: int) -> None:
    """An FP8 [out, in] weight's scale must be its block x block grid."""
    if weight.dim() != 2:
        raise ValueError(f"FP8 weight {name!r} must be 2-D, got shape {tuple(weight.shape)}")
    out, inp = weight.shape
    grid = (-(-out // block), -(-inp // block))
    if tuple(scale.shape) != grid:
        raise ValueError(
            f"FP8 weight {name!r} of shape {(out, inp)} needs a {block}x{block} block scale grid "
            f"of shape {grid}, its scale has shape {tuple(scale.shape)}"
        )


def check_mxfp4(weight: torch.Tensor, scale: torch.Tensor, name: str, group: int) -> None:
    """A packed MXFP4 [out, in/2] weight needs one scale per `group` inputs, [out, in/group]."""
    if weight.dtype not in _FP4_PACKED or weight.dim() != 2:
        raise ValueError(
            f"MXFP4 weight {name!r} must be 2-D packed bytes, got {weight.dtype} "
            f"{tuple(weight.shape)}"
        )
    out, half = weight.shape
    inp = 2 * half
    if inp % group or tuple(scale.shape) != (out, inp // group):
        raise ValueError(
            f"MXFP4 weight {name!r} holds {out}x{inp} values, which need a scale of shape "
            f"{(out, inp // group)} (one per {group} inputs), its scale has shape "
            f"{tuple(scale.shape)}"
        )


def dequantize_fp8(
    weight: torch.Tensor, scale: torch.Tensor, name: str, block: int = FP8_BLOCK
) -> torch.Tensor:
    """FP8 e4m3 [out, in] with per-(block x block) scales -> fp32 [out, in]."""
    check_fp8(weight, scale, name, block)
    out, inp = weight.shape
    s = _scale_values(scale, name)
    s = s.repeat_interleave(block, 0)[:out].repeat_interleave(block, 1)[:, :inp]
    return weight.to(torch.float32) * s


def dequantize_mxfp4(
    weight: torch.Tensor, scale: torch.Tensor, name: str, group: int = MXFP4_GROUP
) -> torch.Tensor:
    """MXFP4 [out, in/2] packed E2M1 pairs with per-`group` UE8M0 scales -> fp32 [out, in]."""
    check_mxfp4(weight, scale, name, group)
    out, inp = weight.shape[0], 2 * weight.shape[1]
    raw = weight.view(torch.uint8).to(torch.long)
    codes = torch.stack([raw & 0xF, raw >> 4], -1).reshape(out, inp)
    values = _E2M1[codes]
    s = e8m0_values(scale, name).repeat_interleave(group, 1)
    return values * s


def is_scale(key: str, tensor: torch.Tensor) -> bool:
    """A quantisation scale. The hyper-connections' mixing scales are also named `.scale`
    (`attn_hc.scale`, [3]) but always fp32; any other `.scale` is a quantisation scale, and
    one in a dtype other than UE8M0 is then an error naming it, not an unexpected tensor."""
    if key.endswith(".weight_scale_inv"):
        return True
    return key.endswith(".scale") and tensor.dtype != torch.float32


def is_quantised(tensor: torch.Tensor) -> bool:
    """FP8 or packed-FP4 storage (int8 / uint8 weights only count when a scale names them)."""
    return tensor.dtype in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2)


class QuantPairs:
    """Matches quantised weights with their scales as a checkpoint streams by.

    keep(weight key): whether the model holds that weight quantised; its pair then comes out
    as raw bytes, `[(key, weight bytes), (base.scale, exponent bytes)]`, else as
    `[(key, fp32 weight)]`. A V3-style fp32 `weight_scale_inv` is not a power of two in
    general, so such a pair is always dequantised (and the scan that lays out kept modules,
    model.weights.quantised_weights, never names it)."""

    def __init__(self, block: int = FP8_BLOCK, keep: Callable[[str], bool] | None = None) -> None:
        self.block = block
        self.keep = keep
        self.weights: dict[str, torch.Tensor] = {}  # base -> weight waiting for its scale
        self.scales: dict[str, tuple[str, torch.Tensor]] = {}  # base -> (key, scale)

    @staticmethod
    def base(key: str) -> str:
        for suffix in (".weight", *_SCALE_SUFFIXES):
            if key.endswith(suffix):
                return key[: -len(suffix)]
        return key

    def add_weight(self, key: str, weight: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The pair's tensors once its scale is known, else [] (held)."""
        base = self.base(key)
        if base in self.scales:
            return self._pair(key, weight, *self.scales.pop(base))
        self.weights[base] = weight
        return []

    def add_scale(self, key: str, scale: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The pair's tensors once its weight is known, else [] (held)."""
        base = self.base(key)
        if base in self.scales:
            raise ValueError(f"two scales for {base!r}: {self.scales[base][0]!r} and {key!r}")
        if base in self.weights:
            return self._pair(base + ".weight", self.weights.pop(base), key, scale)
        self.scales[base] = (key, scale)
        return []

    def _pair(
        self, key: str, weight: torch.Tensor, scale_key: str, scale: torch.Tensor
    ) -> list[tuple[str, torch.Tensor]]:
        fp8 = weight.dtype == torch.float8_e4m3fn
        if not fp8 and weight.dtype not in _FP4_PACKED:
            raise ValueError(
                f"tensor {key!r} has a scale ({scale_key!r}) but dtype {weight.dtype}: expected "
                "FP8 e4m3 or packed FP4"
            )
        if self.keep is not None and scale.dtype != torch.float32 and self.keep(key):
            if fp8:
                check_fp8(weight, scale, key, self.block)
            else:
                check_mxfp4(weight, scale, key, MXFP4_GROUP)
            raw = e8m0_bytes(scale, scale_key)
            return [(key, weight.view(torch.uint8)), (self.base(key) + ".scale", raw)]
        if fp8:
            return [(key, dequantize_fp8(weight, scale, key, self.block))]
        return [(key, dequantize_mxfp4(weight, scale, key))]

    def finish(self) -> None:
        if self.weights:
            names = sorted(self.weights)[:5]
            raise ValueError(f"quantised weights without a scale, e.g. {names}")
        if self.scales:
            names = sorted(k for k, _ in self.scales.values())[:5]
            raise ValueError(f"scales without a quantised (FP8 / packed FP4) weight, e.g. {names}")
