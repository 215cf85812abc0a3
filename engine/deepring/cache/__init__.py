"""Serving caches: block and slot allocators, the per-layer cache tensors."""

from deepring.cache.allocator import BlockAllocator, OutOfBlocks, SlotAllocator
from deepring.cache.pool import CacheConfig, KVCachePool, LayerCache

__all__ = [
    "BlockAllocator",
    "CacheConfig",
    "KVCachePool",
    "LayerCache",
    "OutOfBlocks",
    "SlotAllocator",
]
