"""Prefix-cache identities and the host-memory tier.

Block identity: a full block of `block_size` tokens is named by a hash chain,

    key_0 = H(root, tokens of block 0),  key_i = H(key_{i-1}, tokens of block i)

where root = H(model identity, cache fingerprint) and H is BLAKE2b-256 (collision resistant:
a key names the whole prefix, the model that computed it and the exact tensor layout). Only full
blocks get keys; the partial block at the end of a sequence is never shared.

A block's window-ring snapshot (SWA state at the block's end, see core.prefix) is named
H(b"ring", key): it only ever exists next to its block.

The host tier is a bytes-bounded LRU of records (cache.transfer's self-checking bytes) with an
optional per-entry TTL; entries past their TTL are dropped when met, and the whole tier is swept
as new entries arrive.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from deepring.token_ids import u4_bytes

KEY_BYTES = 32


def _h(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    for p in parts:
        h.update(p)
    return h.digest()


def root_key(model_identity: str, fingerprint: bytes) -> bytes:
    """The chain's root: different models or cache layouts never share a key."""
    return _h(b"deepring-prefix/1\0", model_identity.encode(), b"\0", fingerprint)


def chain_keys(parent: bytes, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Keys of the full blocks of `token_ids`, continuing the chain from `parent`."""
    n = len(token_ids) // block_size
    if n == 0:
        return []
    ids = u4_bytes(token_ids[: n * block_size])
    out = []
    step = 4 * block_size
    for i in range(n):
        parent = _h(parent, ids[i * step : (i + 1) * step])
        out.append(parent)
    return out


def ring_key(block_key: bytes, drafter: str = "") -> bytes:
    """The key of the ring snapshot at the end of `block_key`'s block. A speculative engine's
    snapshot also holds its drafter's window rings (the pool's layers after the backbone),
    whose contents differ by drafter (none, MTP, DSpark): the drafter names the key, so an
    engine only ever restores a drafter context written by the same kind of drafter."""
    if not drafter:
        return _h(b"ring\0", block_key)
    return _h(b"ring\0", block_key, b"\0drafter:", drafter.encode())


class HostTier:
    """Records in host memory, least recently used evicted first once `capacity` bytes are
    exceeded. `ttl_s` per entry (None: until evicted)."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 0:
            raise ValueError("host tier capacity must be >= 0 bytes")
        self.capacity = capacity
        self.clock = clock
        self._items: OrderedDict[bytes, tuple[bytes, float | None]] = OrderedDict()
        self.bytes = 0
        self.stats = {"hits": 0, "misses": 0, "puts": 0, "evictions": 0, "expired": 0}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: bytes) -> bool:
        item = self._items.get(key)
        return item is not None and not self._expired(item[1])

    def _expired(self, deadline: float | None) -> bool:
        return deadline is not None and self.clock() >= deadline

    def get(self, key: bytes) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            self.stats["misses"] += 1
            return None
        if self._expired(item[1]):
            self._drop(key)
            self.stats["expired"] += 1
            self.stats["misses"] += 1
            return None
        self._items.move_to_end(key)
        self.stats["hits"] += 1
        return item[0]

    def put(self, key: bytes, value: bytes, ttl_s: float | None = None) -> bool:
        """Keep `value` (False when it alone exceeds the capacity)."""
        size = len(value)
        if size > self.capacity:
            return False
        if key in self._items:
            self._drop(key)
        deadline = None if ttl_s is None else self.clock() + ttl_s
        self._items[key] = (bytes(value), deadline)
        self.bytes += size
        self.stats["puts"] += 1
        while self.bytes > self.capacity:
            old, (_, dl) = next(iter(self._items.items()))
            self._drop(old)
            self.stats["expired" if self._expired(dl) else "evictions"] += 1
        return True

    def discard(self, key: bytes) -> None:
        if key in self._items:
            self._drop(key)

    def sweep(self) -> int:
        """Drop every expired entry; returns how many."""
        dead = [k for k, (_, dl) in self._items.items() if self._expired(dl)]
        for k in dead:
            self._drop(k)
        self.stats["expired"] += len(dead)
        return len(dead)

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def _drop(self, key: bytes) -> None:
        value, _ = self._items.pop(key)
        self.bytes -= len(value)
