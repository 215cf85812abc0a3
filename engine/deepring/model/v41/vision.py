"""The V4.1 vision tower: canvas pixels -> the embeddings of an image's span of prompt tokens.

What DeepInfer 0.1.0 runs (`models/vision_encoder/vit.py`, `vl_aligner.py`, `mlp_projector.py`,
`tilelang_ops/image_embed_ops.py`; tests/engine/test_v41_vision.py checks this module against
that code):

- Pixels: the image, as the recipe resized it, is pasted centred on a canvas of whole patches
  filled with grey (`int(mean * 255)`), normalised `(x / 255 - mean) / std` with mean = std = 0.5
  (the processor's constants: the HF config does not carry them), rounded to bf16 as DeepInfer's
  lookup table is, and cut into 14 px patches in row-major order.
- A pre-norm ViT (`vision.*`): a linear patch embedding with bias, blocks of RMSNorm ->
  attention (fused qkv with bias, 2D RoPE, non-causal within the image) -> RMSNorm -> SwiGLU
  (`mlp.w1` holds [gate; up]), and a final RMSNorm; eps 1e-6. The 2D RoPE rotates each head's two
  halves (rotate-half) with angles whose first quarter of frequencies follows the patch's row
  and the second its column.
- 3x3 patches are merged (zero-padded at the bottom and right to whole groups; each group's
  features concatenated channel-major, as `F.unfold` orders them) and projected by a two-layer
  GELU MLP (`aligner.w1`, `aligner.w2`) to the language model's width.
- The image's span in the prompt is `image_start`, then each row of merged patches followed by
  `image_newline`, then `image_end` (the three are learned vectors of the checkpoint).

The tower's shape is fixed in DeepInfer (1024 wide, 32 blocks of 16 heads, SwiGLU 2816); the HF
`vision_config` gives `hidden_size`, `patch_size` and `downsample_ratio`. `depth`, `num_heads`
and `intermediate_size` there (our extension, for small test models) default to those constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from deepring.image_spans import (  # noqa: F401 - SPAN_IDS, span_ids re-exported
    RECIPE_MERGE,
    RECIPE_PATCH,
    SPAN_IDS,
    merged,
    span_ids,
    span_length,
)
from deepring.model.norm import RMSNorm

PIXEL_MEAN = 0.5
PIXEL_STD = 0.5
_DEPTH, _HEADS, _MLP_RATIO, _MULTIPLE_OF = 32, 16, 2.7, 128


@dataclass(frozen=True)
class VisionConfig:
    width: int
    depth: int
    num_heads: int
    intermediate: int
    patch_size: int
    downsample_ratio: int
    text_hidden: int
    max_image_tokens: int = 1024
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def pad_color(self) -> int:
        return max(0, min(255, int(PIXEL_MEAN * 255)))  # truncated, as DeepInfer derives it

    @classmethod
    def from_dict(cls, d: dict[str, Any], text_hidden: int) -> VisionConfig | None:
        """From the checkpoint's `vision_config` (None when it has none)."""
        if not d:
            return None
        width = int(d.get("hidden_size", 1024))
        inter = d.get("intermediate_size")
        if inter is None:  # DeepInfer's SwiGLU sizing: ratio 2.7, rounded up to 128
            inter = _MULTIPLE_OF * math.ceil(int(width * _MLP_RATIO) / _MULTIPLE_OF)
        c = cls(
            width=width,
            depth=int(d.get("depth", _DEPTH)),
            num_heads=int(d.get("num_heads", _HEADS)),
            intermediate=int(inter),
            patch_size=int(d.get("patch_size", 14)),
            downsample_ratio=int(d.get("downsample_ratio", 3)),
            text_hidden=text_hidden,
            max_image_tokens=int(d.get("max_image_tokens", 1024)),
        )
        problems = [
            m
            for bad, m in (
                (c.width < 1 or c.depth < 1 or c.num_heads < 1, "sizes must be >= 1"),
                (c.width % c.num_heads != 0, "hidden_size must be a multiple of num_heads"),
                (c.head_dim % 4 != 0, "the head size must be a multiple of 4 (2D RoPE)"),
                (c.patch_size < 1 or c.downsample_ratio < 1, "patch and merge sizes must be >= 1"),
            )
            if bad
        ]
        if problems:
            raise ValueError(f"invalid vision_config: {'; '.join(problems)}")
        return c

    def merged(self, n_w: int, n_h: int) -> tuple[int, int]:
        """(columns, rows) of merged patches (tokens per row, rows) of an n_w x n_h patch grid."""
        return merged(n_w, n_h, self.downsample_ratio)

    def span_tokens(self, n_w: int, n_h: int) -> int:
        """Prompt tokens of an image on an n_w x n_h patch grid: start, rows + newlines, end."""
        return span_length(n_w, n_h, self.downsample_ratio)

    def recipe_sized(self) -> bool:
        """Whether the recipe's image sizing (14 px patches, 3 x 3 merged) is this tower's."""
        return (self.patch_size, self.downsample_ratio) == (RECIPE_PATCH, RECIPE_MERGE)


def image_rows(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Which of `ids` are image tokens (bool, same shape)."""
    return (ids >= vocab) & (ids < vocab + SPAN_IDS)


def image_patches(rgb: torch.Tensor, n_w: int, n_h: int, config: VisionConfig) -> torch.Tensor:
    """uint8 [height, width, 3] pixels -> [n_h * n_w, 3, p, p] fp32 patches (values bf16-exact)
    of the n_w x n_h patch canvas, the image centred on grey."""
    p = config.patch_size
    gw, gh = n_w * p, n_h * p
    h, w = rgb.shape[0], rgb.shape[1]
    if rgb.dtype != torch.uint8 or rgb.dim() != 3 or rgb.shape[2] != 3:
        raise ValueError(
            f"expected uint8 [height, width, 3] pixels, got {rgb.dtype} {tuple(rgb.shape)}"
        )
    if h > gh or w > gw:
        raise ValueError(f"a {w}x{h} image does not fit its {gw}x{gh} canvas")
    canvas = torch.full((gh, gw, 3), config.pad_color, dtype=torch.uint8)
    left, top = round((gw - w) * 0.5), round((gh - h) * 0.5)  # Python's rounding, as DeepInfer
    canvas[top : top + h, left : left + w] = rgb
    table = ((torch.arange(256, dtype=torch.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD).to(
        torch.bfloat16
    )
    chw = table[canvas.permute(2, 0, 1).long()].float()
    return chw.reshape(3, n_h, p, n_w, p).permute(1, 3, 0, 2, 4).reshape(n_h * n_w, 3, p, p)


def patch_positions(n_w: int, n_h: int) -> torch.Tensor:
    """[n_h * n_w, 2] (row, column) of each patch, row-major."""
    rows = torch.arange(n_h).unsqueeze(1).expand(n_h, n_w)
    cols = torch.arange(n_w).unsqueeze(0).expand(n_h, n_w)
    return torch.stack([rows, cols], dim=-1).reshape(-1, 2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the whole head: x [n, heads, d], cos / sin [n, d / 2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class _Attention(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.heads = c.num_heads
        self.wqkv = nn.Linear(c.width, 3 * c.width)
        self.wo = nn.Linear(c.width, c.width)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lens: list[int]):
        n, width = x.shape
        q, k, v = self.wqkv(x).view(n, 3, self.heads, width // self.heads).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out, start = [], 0
        for m in lens:  # each image attends to itself only, both ways
            s = slice(start, start + m)
            out.append(
                F.scaled_dot_product_attention(
                    q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1)
                ).transpose(0, 1)
            )
            start += m
        return self.wo(torch.cat(out).reshape(n, width))


class _SwiGLU(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(c.width, 2 * c.intermediate, bias=False)  # [gate; up]
        self.w2 = nn.Linear(c.intermediate, c.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w1(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class _Block(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(c.width, c.norm_eps)
        self.attn = _Attention(c)
        self.norm2 = RMSNorm(c.width, c.norm_eps)
        self.mlp = _SwiGLU(c)

    def forward(self, x, cos, sin, lens):
        x = x + self.attn(self.norm1(x), cos, sin, lens)
        return x + self.mlp(self.norm2(x))


class _PatchEmbed(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * c.patch_size * c.patch_size, c.width)


class VisionTower(nn.Module):
    """The ViT (`vision.*` in the checkpoint): patches -> per-patch features."""

    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.config = c
        self.patch_embed = _PatchEmbed(c)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.depth))
        self.norm = RMSNorm(c.width, c.norm_eps)
        quarter = c.head_dim // 4  # frequencies per axis
        exps = torch.arange(0, 2 * quarter, 2, dtype=torch.float32) / (2 * quarter)
        self.register_buffer("inv_freq", 1.0 / c.rope_theta**exps, persistent=False)

    def forward(self, patches: torch.Tensor, positions: torch.Tensor, lens: list[int]):
        """patches [n, 3, p, p] of images of `lens` patches each; positions [n, 2] (row, col)."""
        x = self.patch_embed.proj(patches.reshape(patches.shape[0], -1).to(self.inv_freq.device))
        angles = positions.to(self.inv_freq).unsqueeze(-1) * self.inv_freq  # [n, 2, quarter]
        angles = angles.reshape(len(positions), -1)  # (row freqs, column freqs)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin, lens)
        return self.norm(x)


class Aligner(nn.Module):
    """The projector (`aligner.*`): merged patches -> the language model's width."""

    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        r = c.downsample_ratio
        self.w1 = nn.Linear(c.width * r * r, c.text_hidden)
        self.w2 = nn.Linear(c.text_hidden, c.text_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


def merge_patches(features: torch.Tensor, n_w: int, n_h: int, r: int) -> torch.Tensor:
    """[n_h * n_w, dim] -> [rows * cols, dim * r * r]: each r x r group (zero-padded at the
    bottom and right), its features channel-major (feature, row in group, column in group)."""
    dim = features.shape[-1]
    grid = features.reshape(n_h, n_w, dim)
    grid = F.pad(grid, (0, 0, 0, (-n_w) % r, 0, (-n_h) % r))
    rows, cols = grid.shape[0] // r, grid.shape[1] // r
    groups = grid.reshape(rows, r, cols, r, dim).permute(0, 2, 4, 1, 3)
    return groups.reshape(rows * cols, dim * r * r)


@torch.no_grad()
def embed_images(
    tower: VisionTower, aligner: Aligner, special: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    images: list[tuple[torch.Tensor, int, int]],
) -> list[torch.Tensor]:  # fmt: skip
    """Each image's span embeddings [span_tokens, text_hidden]. images: (uint8 pixels
    [h, w, 3], n_w, n_h), the patch grid the prompt's span was sized for; special: the
    checkpoint's (image_start, image_newline, image_end) vectors."""
    if not images:
        return []
    c = tower.config
    start, newline, end = special
    dtype = tower.patch_embed.proj.weight.dtype
    patches = torch.cat([image_patches(px, w, h, c) for px, w, h in images])
    positions = torch.cat([patch_positions(w, h) for _, w, h in images])
    lens = [w * h for _, w, h in images]
    feats = tower(patches.to(tower.inv_freq.device, dtype), positions, lens)
    out, at = [], 0
    for (_, w, h), m in zip(images, lens, strict=True):
        merged = aligner(merge_patches(feats[at : at + m], w, h, c.downsample_ratio))
        at += m
        cols, rows = c.merged(w, h)
        grid = merged.reshape(rows, cols, -1)
        nl = newline.to(grid.dtype).expand(rows, 1, grid.shape[-1])
        body = torch.cat([grid, nl], dim=1).reshape(rows * (cols + 1), -1)
        out.append(torch.cat([start[None].to(body.dtype), body, end[None].to(body.dtype)]))
    return out
