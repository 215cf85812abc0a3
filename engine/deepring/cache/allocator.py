"""Ref-counted allocators for paged-cache blocks and per-request state slots.

A block may be shared by several requests (prefix caching hands out the same full block to every
request whose prompt starts with it): `share` adds a reference, `free` drops one, and a block
returns to the free list only when its last reference goes. Block 0 is reserved: block tables
are padded with it, so a padded lookup reads harmless memory instead of another request's block.
"""

from __future__ import annotations

from collections import deque


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

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.reserved - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError("cannot allocate a negative number of blocks")
        if n > len(self._free):
            raise OutOfBlocks(f"need {n} blocks, {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        return out

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
