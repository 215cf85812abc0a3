"""The persistent tiers of the prefix KV cache: 128-token blocks as opaque values under 32-byte
keys, each kept for a TTL, in a directory (a local disk or a mount many machines share) or in
Redis, behind one interface (`BlockStore`, base.py)."""

from deepring.cache.store.base import COUNTERS, BlockStore, StoredBlock, StoreUnavailable
from deepring.cache.store.directory import DirectoryStore
from deepring.cache.store.sweeper import Sweeper
from deepring.cache.store.url import open_store

__all__ = [
    "COUNTERS",
    "BlockStore",
    "DirectoryStore",
    "StoreUnavailable",
    "StoredBlock",
    "Sweeper",
    "open_store",
]
