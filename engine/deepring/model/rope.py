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


# Rotations of positions below this are looked up in a table built on first need (2^16
# positions take 16 MiB per kind at V4's 64 rope channels); later ones are computed per call.
TABLE_POSITIONS = 1 << 16


class RopeTables:
    """inv_freq for the `main` (sliding layers) and `compress` (CSA/HCA layers, indexer) RoPEs,
    and tables of their rotations by position."""

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        dim = config.rope_head_dim
        self.main = default_inv_freq(dim, config.rope_theta).to(device)
        if config.yarn is None:
            comp = default_inv_freq(dim, config.compress_rope_theta)
        else:
            comp = yarn_inv_freq(dim, config.compress_rope_theta, config.yarn)
        self.compress = comp.to(device)
        self._tables: dict[str, torch.Tensor] = {}

    def cis(self, positions: torch.Tensor, kind: str, max_pos: int | None = None) -> torch.Tensor:
        """exp(i * angle) as complex64 [*positions.shape, rope_dim // 2]: the same values as
        torch.complex(*cos_sin(positions, kind)). max_pos: the largest position, if known.

        A step looks its rotations up (one op) instead of computing them (half a dozen): a
        decode step of a small model is dominated by the count of its ops."""
        if max_pos is None:
            max_pos = int(positions.max()) if positions.numel() else 0
        if max_pos >= TABLE_POSITIONS:
            return torch.complex(*self.cos_sin(positions, kind))
        table = self._tables.get(kind)
        if table is None or table.shape[0] <= max_pos:
            have = 0 if table is None else table.shape[0]
            n = min(TABLE_POSITIONS, max(max_pos + 1, 2 * have, 4096))
            pos = torch.arange(n, device=positions.device)
            table = self._tables[kind] = torch.complex(*self.cos_sin(pos, kind))
        return table.index_select(0, positions.reshape(-1)).view(*positions.shape, -1)

    def cos_sin(
        self, positions: torch.Tensor, kind: str, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape [*positions.shape, rope_dim // 2] for `kind` in {main, compress}."""
        inv = self.main if kind == "main" else self.compress
        freqs = positions.to(torch.float32)[..., None] * inv
        return freqs.cos().to(dtype), freqs.sin().to(dtype)
