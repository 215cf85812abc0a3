"""Ref-counted allocators for paged-cache blocks and per-request state slots.

A block may be shared by several requests (prefix caching hands out the same full block to every
request whose prompt starts with it): `share` adds a reference, `free` drops one. Block 0 is
reserved: block tables are padded with it, so a padded lookup reads harmless memory instead of
another request's block.

The device tier of the prefix cache lives here too: a full block can be `publish`ed under its
prefix key. When its last reference goes, a published block is not freed but kept, unreferenced,
in least-recently-used order; `lookup` finds it by key and `take` revives it. `allocate` uses
free blocks first and then evicts the least recently used cached ones (their keys are dropped;
the host and persistent tiers keep copies), so cached blocks cost nothing until room is needed.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class OutOfBlocks(RuntimeError):
    """The pool cannot satisfy an allocation; the caller should wait or preempt."""


class BlockAllocator:
    def __init__(self, num_blocks: int, reserved: int = 1) -> None:
        if num_blocks <= reserved:
            raise ValueError(f"num_blocks ({num_blocks}) must exceed reserved blocks ({reserved})")
        self.num_blocks = num_blocks
        self.reserved = reserved
        self._free: deque[int] = deque(range(reserved, num_blocks))
        self._refs = [0] * num_blocks
        self._cached: OrderedDict[int, None] = OrderedDict()  # unreferenced, published; LRU first
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: free ones and unreferenced cached ones."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached(self) -> int:
        """Published blocks (referenced or not)."""
        return len(self._block_of)

    @property
    def num_used(self) -> int:
        """Blocks some request references."""
        return self.num_blocks - self.reserved - self.num_free

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError("cannot allocate a negative number of blocks")
        if n > self.num_free:
            raise OutOfBlocks(f"need {n} blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:  # evict the least recently used cached block
                b, _ = self._cached.popitem(last=False)
                del self._block_of[self._key_of.pop(b)]
                self.num_evictions += 1
            self._refs[b] = 1
            out.append(b)
        return out

    # ---- prefix-cache index --------------------------------------------------------------------

    def publish(self, block: int, key: bytes) -> bool:
        """Make an allocated full block findable under `key`. False (nothing changes) when the
        key already names another block or the block already has a key."""
        if self._refs[block] <= 0:
            raise ValueError(f"cannot publish block {block}: it is not allocated")
        if key in self._block_of or block in self._key_of:
            return False
        self._block_of[key] = block
        self._key_of[block] = key
        return True

    def lookup(self, key: bytes) -> int | None:
        return self._block_of.get(key)

    def key_of(self, block: int) -> bytes | None:
        return self._key_of.get(block)

    def take(self, block: int) -> None:
        """One more reference to a published block, reviving it if it was unreferenced."""
        if block in self._cached:
            del self._cached[block]
            self._refs[block] = 1
        elif self._refs[block] > 0:
            self._refs[block] += 1
        else:
            raise ValueError(f"block {block} is neither allocated nor cached")

    def drop_cached(self) -> int:
        """Forget every unreferenced cached block (they become free); returns how many."""
        n = len(self._cached)
        for b in self._cached:
            del self._block_of[self._key_of.pop(b)]
            self._free.append(b)
        self._cached.clear()
        return n

    def share(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._refs[b] <= 0:
                raise ValueError(f"cannot share block {b}: it is not allocated")
        for b in blocks:
            self._refs[b] += 1

    def free(self, blocks: list[int]) -> list[int]:
        """Drop one reference to each block; returns the blocks that became free."""
        for b in blocks:
            if b < self.reserved or self._refs[b] <= 0:
                raise ValueError(f"block {b} is not allocated")
        released = []
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                if b in self._key_of:
                    self._cached[b] = None  # most recently used last
                else:
                    self._free.append(b)
                released.append(b)
        return released

    def refcount(self, block: int) -> int:
        return self._refs[block]


class SlotAllocator:
    """Per-request state slots (window ring + compressor tails); one owner each."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("num_slots must be >= 1")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocks("no free state slot")
        s = self._free.popleft()
        self._used.add(s)
        return s

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise ValueError(f"slot {slot} is not allocated")
        self._used.remove(slot)
        self._free.append(slot)
