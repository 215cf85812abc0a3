"""Cache tensors of a DeepSeek V4 model, shaped for serving from a CacheLayout.

Per layer:
- window ring `ring[slot, pos % ring_len]`: the last ring_len = W + B shared K=V vectors of each
  request (W = sliding window, B = slots kept for rolling back rejected speculative tokens);
- compressed layers (CSA ratio m, HCA ratio m'): the paged cache `comp[block, entry]` holding
  block_size / m compressed entries per block (128-token blocks: 32 CSA entries, 1 HCA entry),
  and the compressor tail `tail_kv / tail_gate[slot, pos % tail_len]`: projected rows of
  positions whose window is not complete yet (CSA keeps 2m rows, because each entry also pools
  the previous window);
- CSA layers also have the indexer's paged keys `index[block, entry]` and its own tail;
- CSA layers keep, per block, its edge: the first half (Ca) of the compressor's projected rows
  of the block's last m positions, `edge_kv / edge_gate[block, m, head_dim]` (and the indexer's
  `index_edge_*`). The first entry of the next block pools those rows with its own, so they are
  what a request continuing from the block's end needs beyond the paged entries: with them a
  block is self-contained for the prefix cache (the tail is rebuilt from them on a hit). HCA
  windows never cross a block boundary (block_size is a multiple of every ratio), so an HCA
  layer needs no edge.
Blocks are addressed through per-request block tables (see cache.allocator); slots are per
request. MTP layers follow the backbone layers (index num_hidden_layers + i).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepring.cache.layout import CacheLayout

# Which LayerCache tensors belong to a request's slot and which to its blocks, in the order
# cache.transfer serialises them.
SLOT_FIELDS = ("ring", "tail_kv", "tail_gate", "index_tail_kv", "index_tail_gate")
BLOCK_FIELDS = (
    "comp", "index", "edge_kv", "edge_gate", "index_edge_kv", "index_edge_gate",
)  # fmt: skip


@dataclass(frozen=True)
class CacheConfig:
    num_blocks: int = 256
    num_slots: int = 64
    block_size: int = 128
    backtrack: int = 2  # B: ring slots beyond the window, for speculative rollback

    def __post_init__(self) -> None:
        for name in ("num_blocks", "num_slots", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"CacheConfig.{name} must be >= 1")
        if self.backtrack < 0:
            raise ValueError("CacheConfig.backtrack must be >= 0")


@dataclass
class LayerCache:
    ring: torch.Tensor  # [slots, ring_len, head_dim]
    ratio: int = 0
    comp: torch.Tensor | None = None  # [blocks, block_size // ratio, head_dim]
    tail_kv: torch.Tensor | None = None  # [slots, tail_len, width]
    tail_gate: torch.Tensor | None = None
    index: torch.Tensor | None = None  # [blocks, block_size // ratio, index_head_dim]
    index_tail_kv: torch.Tensor | None = None
    index_tail_gate: torch.Tensor | None = None
    edge_kv: torch.Tensor | None = None  # [blocks, ratio, head_dim] (CSA)
    edge_gate: torch.Tensor | None = None
    index_edge_kv: torch.Tensor | None = None  # [blocks, ratio, index_head_dim] (CSA)
    index_edge_gate: torch.Tensor | None = None


class KVCachePool:
    def __init__(
        self, layout: CacheLayout, cache: CacheConfig, device: torch.device | str = "cpu"
    ) -> None:
        if cache.block_size % layout.min_block_size():
            raise ValueError(
                f"block_size {cache.block_size} must be a multiple of every compress ratio "
                f"({layout.min_block_size()})"
            )
        self.layout = layout
        self.cache = cache
        self.dtype = layout.dtype
        self.device = torch.device(device)
        self.ring_len = layout.window + cache.backtrack
        self.layers: list[LayerCache] = []
        for lay in layout.layers:
            ring = self._zeros(cache.num_slots, self.ring_len, lay.head_dim)
            if not lay.compressed:
                self.layers.append(LayerCache(ring=ring))
                continue
            epb = cache.block_size // lay.ratio
            tail = (cache.num_slots, lay.tail_len, lay.tail_width)
            lc = LayerCache(
                ring=ring,
                ratio=lay.ratio,
                comp=self._zeros(cache.num_blocks, epb, lay.page_width, fp4=lay.fp4),
                tail_kv=self._zeros(*tail) if lay.has_tail else None,
                tail_gate=self._zeros(*tail) if lay.has_tail else None,
            )
            if lay.overlap:
                lc.edge_kv = self._zeros(cache.num_blocks, lay.ratio, lay.head_dim)
                lc.edge_gate = self._zeros(cache.num_blocks, lay.ratio, lay.head_dim)
            if lay.index_head_dim and not lay.has_index_tail:  # CSA2: keys only
                lc.index = self._zeros(cache.num_blocks, epb, lay.index_page_width, fp4=lay.fp4)
            elif lay.index_head_dim:
                lc.index_edge_kv = self._zeros(cache.num_blocks, lay.ratio, lay.index_head_dim)
                lc.index_edge_gate = self._zeros(cache.num_blocks, lay.ratio, lay.index_head_dim)
                index_tail = (cache.num_slots, lay.tail_len, lay.index_tail_width)
                lc.index = self._zeros(cache.num_blocks, epb, lay.index_head_dim)
                lc.index_tail_kv = self._zeros(*index_tail)
                lc.index_tail_gate = self._zeros(*index_tail)
            self.layers.append(lc)

    def _zeros(self, *shape: int, fp4: bool = False) -> torch.Tensor:
        dtype = torch.uint8 if fp4 else self.dtype  # FP4 pages are bytes (model.v41.kvquant)
        return torch.zeros(*shape, dtype=dtype, device=self.device)

    def slot_tensors(self) -> list[torch.Tensor]:
        """Every tensor indexed by slot (first axis), in serialisation order."""
        return [t for lc in self.layers for f in SLOT_FIELDS if (t := getattr(lc, f)) is not None]

    def block_tensors(self) -> list[torch.Tensor]:
        """Every tensor indexed by block (first axis), in serialisation order."""
        return [t for lc in self.layers for f in BLOCK_FIELDS if (t := getattr(lc, f)) is not None]

    def bytes_per_block(self) -> int:
        """Paged-cache bytes of one block over all layers."""
        return sum(t[0].numel() * t.element_size() for t in self.block_tensors())

    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.slot_tensors())
