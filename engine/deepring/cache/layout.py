"""What a model needs cached, layer by layer: the cache's side of the model/cache contract.

The model configuration produces a CacheLayout (`ModelConfig.cache_layout`); the pool, the
transfer format and the sizing code read only this, never the model's configuration, so the
cache package knows shapes and dtypes, not modules.

Per layer (V4):
- every layer keeps a sliding-window ring of its shared K=V vectors (width `head_dim`);
- a compressed layer (CSA ratio 4, HCA ratio 128) also keeps paged entries of `head_dim`, one
  per `ratio` tokens, and a compressor tail: the projected rows of positions whose window is not
  complete yet. CSA windows overlap, so its tail holds 2 x ratio rows of twice the width;
- a CSA layer also keeps the lightning indexer's paged keys (`index_head_dim`) and its tail.

V4.1 (model.v41) adds CSA2, the kind of its KV-source layers: paged main-KV entries (ratio 2 or
1, windows never overlap), paged indexer keys (projected from the main entries, so the indexer
has no tail of its own) and, at ratio 2, a compressor tail of `ratio` rows. Its other layers are
SLIDING here: they read a source's pages and keep only their own ring.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SLIDING = "sliding"
CSA = "csa"
HCA = "hca"
CSA2 = "csa2"
KINDS = (SLIDING, CSA, HCA, CSA2)


def block_multiple(ratios: Iterable[int]) -> int:
    """Smallest block length that every compress ratio (0: none) divides evenly."""
    out = 1
    for r in ratios:
        if r:
            out = out * r // math.gcd(out, r)
    return out


@dataclass(frozen=True)
class LayerLayout:
    kind: str  # SLIDING | CSA | HCA
    ratio: int  # tokens per compressed entry (0: sliding only)
    head_dim: int  # width of the ring's and the paged cache's vectors
    index_head_dim: int = 0  # CSA: width of the indexer's keys
    # CSA2 only: main entries and indexer keys stored FP4 (bytes: values and group scales,
    # model.v41.kvquant), whatever the layout's dtype.
    fp4: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"layer kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == SLIDING) != (self.ratio == 0) or self.ratio < 0:
            raise ValueError(f"a {self.kind} layer cannot have compress ratio {self.ratio}")
        if self.head_dim < 1 or (self.kind in (CSA, CSA2)) != (self.index_head_dim > 0):
            raise ValueError(f"bad widths for a {self.kind} layer")
        if self.fp4 and (self.kind != CSA2 or self.head_dim % 16 or self.index_head_dim % 32):
            raise ValueError("FP4 entries need a CSA2 layer, head_dim % 16 and index % 32")

    @property
    def compressed(self) -> bool:
        return self.ratio > 0

    @property
    def overlap(self) -> bool:
        """CSA windows overlap: each entry also pools the previous window's rows."""
        return self.kind == CSA

    @property
    def tail_len(self) -> int:
        return 2 * self.ratio if self.overlap else self.ratio

    @property
    def tail_width(self) -> int:
        return 2 * self.head_dim if self.overlap else self.head_dim

    @property
    def index_tail_width(self) -> int:
        return 2 * self.index_head_dim

    @property
    def has_tail(self) -> bool:
        """Whether positions can wait for their window (a ratio-1 CSA2 layer never waits)."""
        return self.compressed and not (self.kind == CSA2 and self.ratio == 1)

    @property
    def page_width(self) -> int:
        """Elements per paged main entry (bytes when FP4: values + one E4M3 scale per 16)."""
        return self.head_dim // 2 + self.head_dim // 16 if self.fp4 else self.head_dim

    @property
    def index_page_width(self) -> int:
        """Elements per paged indexer key (bytes when FP4: values + one E8M0 scale per 32)."""
        d = self.index_head_dim
        return d // 2 + d // 32 if self.fp4 else d

    @property
    def has_index_tail(self) -> bool:
        """V4's indexer has a compressor of its own; CSA2's keys come from the main entries."""
        return self.kind == CSA


@dataclass(frozen=True)
class CacheLayout:
    """The cached state of one model: backbone layers, then MTP layers."""

    layers: tuple[LayerLayout, ...]
    window: int  # sliding window W (the ring keeps W + backtrack positions)
    dtype: torch.dtype  # storage dtype of every cache tensor

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a cache layout needs at least one layer")
        if self.window < 1:
            raise ValueError("the sliding window must be >= 1")

    def min_block_size(self) -> int:
        """Smallest cache block length every compressed layer divides evenly."""
        return block_multiple(lay.ratio for lay in self.layers)

    def describe(self) -> str:
        """A stable text naming every layer's kind and widths and the dtype (fingerprints)."""
        parts = [
            f"{lay.kind}:{lay.ratio}:{lay.head_dim}:{lay.index_head_dim}"
            + (":fp4" if lay.fp4 else "")
            for lay in self.layers
        ]
        return f"w{self.window}/{str(self.dtype).replace('torch.', '')}/" + ",".join(parts)
