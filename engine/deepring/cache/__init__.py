"""Serving caches: the layout a model asks for, block and slot allocators, the per-layer cache
tensors, and the serialisation that moves a request's cache state between pools."""

from deepring.cache.allocator import BlockAllocator, OutOfBlocks, SlotAllocator
from deepring.cache.layout import CacheLayout, LayerLayout
from deepring.cache.pool import CacheConfig, KVCachePool, LayerCache

__all__ = [
    "BlockAllocator",
    "CacheConfig",
    "CacheLayout",
    "KVCachePool",
    "LayerCache",
    "LayerLayout",
    "OutOfBlocks",
    "SlotAllocator",
]
