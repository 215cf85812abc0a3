"""Cache tensors of a DeepSeek V4 model, shaped for serving.

Per layer:
- window ring `ring[slot, pos % ring_len]`: the last ring_len = W + B shared K=V vectors of each
  request (W = sliding window, B = slots kept for rolling back rejected speculative tokens);
- compressed layers (CSA ratio m, HCA ratio m'): the paged cache `comp[block, entry]` holding
  block_size / m compressed entries per block (128-token blocks: 32 CSA entries, 1 HCA entry),
  and the compressor tail `tail_kv / tail_gate[slot, pos % tail_len]`: projected rows of
  positions whose window is not complete yet (CSA keeps 2m rows, because each entry also pools
  the previous window);
- CSA layers also have the indexer's paged keys `index[block, entry]` and its own tail.
Blocks are addressed through per-request block tables (see cache.allocator); slots are per
request. MTP layers follow the backbone layers (index num_hidden_layers + i).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepring.model.config import CSA, SLIDING, ModelConfig


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


class KVCachePool:
    def __init__(
        self,
        config: ModelConfig,
        cache: CacheConfig,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if cache.block_size % config.min_block_size():
            raise ValueError(
                f"block_size {cache.block_size} must be a multiple of every compress ratio "
                f"({config.min_block_size()})"
            )
        self.config = config
        self.cache = cache
        self.dtype = dtype
        self.device = torch.device(device)
        self.ring_len = config.sliding_window + cache.backtrack
        hd, ihd = config.head_dim, config.index_head_dim
        self.layers: list[LayerCache] = []
        for layer_type in list(config.layer_types) + list(config.mtp_layer_types):
            ring = self._zeros(cache.num_slots, self.ring_len, hd)
            if layer_type == SLIDING:
                self.layers.append(LayerCache(ring=ring))
                continue
            m = config.compress_rate(layer_type)
            epb = cache.block_size // m
            overlap = layer_type == CSA
            tail = 2 * m if overlap else m
            width = 2 * hd if overlap else hd
            lc = LayerCache(
                ring=ring,
                ratio=m,
                comp=self._zeros(cache.num_blocks, epb, hd),
                tail_kv=self._zeros(cache.num_slots, tail, width),
                tail_gate=self._zeros(cache.num_slots, tail, width),
            )
            if overlap:
                lc.index = self._zeros(cache.num_blocks, epb, ihd)
                lc.index_tail_kv = self._zeros(cache.num_slots, tail, 2 * ihd)
                lc.index_tail_gate = self._zeros(cache.num_slots, tail, 2 * ihd)
            self.layers.append(lc)

    def _zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=self.dtype, device=self.device)

    def bytes_per_block(self) -> int:
        """Paged-cache bytes of one block over all layers."""
        total = 0
        for lc in self.layers:
            for t in (lc.comp, lc.index):
                if t is not None:
                    total += t[0].numel() * t.element_size()
        return total

    def bytes_per_slot(self) -> int:
        total = 0
        for lc in self.layers:
            for t in (lc.ring, lc.tail_kv, lc.tail_gate, lc.index_tail_kv, lc.index_tail_gate):
                if t is not None:
                    total += t[0].numel() * t.element_size()
        return total
