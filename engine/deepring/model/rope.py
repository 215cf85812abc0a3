"""Rotary tables: plain RoPE for sliding-only layers, YaRN-scaled RoPE for compressed ones.

V4 rotates interleaved channel pairs of the trailing `rope_head_dim` channels, so a table holds
one angle per pair (`rope_head_dim // 2` columns). Compressed-attention YaRN never multiplies
cos/sin by an attention factor (V4 pins it to 1).
"""

from __future__ import annotations

import math

import torch

from deepring.model.config import ModelConfig, YarnScaling


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def yarn_inv_freq(dim: int, theta: float, yarn: YarnScaling) -> torch.Tensor:
    """NTK-by-parts interpolation between the original and `factor`-stretched frequencies."""

    def correction_dim(rotations: float) -> float:
        orig = yarn.original_max_position_embeddings
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    # The correction range is always truncated to whole dimensions (as the reference does).
    low = max(math.floor(correction_dim(yarn.beta_fast)), 0)
    high = min(math.ceil(correction_dim(yarn.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1.0 - ramp
    pos = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    return (1.0 / (yarn.factor * pos)) * (1 - extrapolate) + (1.0 / pos) * extrapolate


class RopeTables:
    """inv_freq for the `main` (sliding layers) and `compress` (CSA/HCA layers, indexer) RoPEs."""

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        dim = config.rope_head_dim
        self.main = default_inv_freq(dim, config.rope_theta).to(device)
        if config.yarn is None:
            comp = default_inv_freq(dim, config.compress_rope_theta)
        else:
            comp = yarn_inv_freq(dim, config.compress_rope_theta, config.yarn)
        self.compress = comp.to(device)

    def cos_sin(
        self, positions: torch.Tensor, kind: str, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape [*positions.shape, rope_dim // 2] for `kind` in {main, compress}."""
        inv = self.main if kind == "main" else self.compress
        freqs = positions.to(torch.float32)[..., None] * inv
        return freqs.cos().to(dtype), freqs.sin().to(dtype)
