"""Device -> host copies of cache records that overlap the steps that follow them.

The prefix cache copies every block it publishes, and every ring snapshot it takes, to the host
tier. On a CPU pool that is a memory copy and happens at once. On a CUDA pool a plain copy would
make the step wait for the device to drain; instead:

1. the record's rows are gathered into one device buffer on the compute stream (a snapshot in
   stream order: a later step may overwrite the ring or reuse the block, the buffer keeps the
   bytes as they were);
2. a side stream waits for that gather, copies the buffer into pinned host memory without
   blocking, and records an event;
3. `poll()`, called once per step, seals the records whose event has fired (header and
   checksum) and hands them to their callback.

Until a record is sealed its block is still in the device tier (a published block is only
evicted by a later allocation), so nothing is lost while a copy is in flight; if the block is
evicted first, a later request misses the host tier and computes the block again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from deepring.cache.pool import KVCachePool
from deepring.cache.transfer import (
    HEADER_BYTES,
    KIND_BLOCKS,
    KIND_RING,
    export_blocks,
    export_ring,
    gather,
    seal,
)

Done = Callable[[bytes], None]


@dataclass
class _InFlight:
    kind: int
    rows: int
    event: torch.cuda.Event
    host: torch.Tensor  # pinned, [rows, row_bytes]
    done: Done


class HostCopies:
    """Record copies of one pool. `pending` counts the copies not yet handed over."""

    def __init__(self, pool: KVCachePool | None) -> None:
        self.pool = pool
        cuda = pool is not None and pool.device.type == "cuda"
        self._stream = torch.cuda.Stream(pool.device) if cuda else None
        self._flight: deque[_InFlight] = deque()

    @property
    def pending(self) -> int:
        return len(self._flight)

    def blocks(self, blocks: list[int], done: Done) -> None:
        """Copy the record of `blocks` (cache.transfer.export_blocks) and give it to `done`."""
        if self._stream is None:
            done(bytes(export_blocks(self.pool, blocks)))
        else:
            self._copy(KIND_BLOCKS, list(blocks), done)

    def ring(self, slot: int, done: Done) -> None:
        """Copy the window rings of `slot` (cache.transfer.export_ring) and give them to `done`."""
        if self._stream is None:
            done(bytes(export_ring(self.pool, slot)))
        else:
            self._copy(KIND_RING, [slot], done)

    def _copy(self, kind: int, idx: list[int], done: Done) -> None:
        assert self._stream is not None  # (the callers' branch)
        rows = gather(kind, self.pool, idx)  # on the compute stream
        host = torch.empty(rows.shape, dtype=torch.uint8, pin_memory=True)
        compute = torch.cuda.current_stream(rows.device)
        with torch.cuda.stream(self._stream):
            self._stream.wait_stream(compute)
            host.copy_(rows, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        # The caching allocator may hand `rows` to the compute stream again once it is freed:
        # tell it the side stream still reads it.
        rows.record_stream(self._stream)
        self._flight.append(_InFlight(kind, len(idx), event, host, done))

    def poll(self) -> int:
        """Hand over every copy that has finished (in submission order); how many."""
        n = 0
        while self._flight and self._flight[0].event.query():
            self._finish(self._flight.popleft())
            n += 1
        return n

    def drain(self) -> None:
        """Wait for every copy in flight and hand it over (shutdown, tests)."""
        while self._flight:
            item = self._flight.popleft()
            item.event.synchronize()
            self._finish(item)

    def _finish(self, item: _InFlight) -> None:
        buf = bytearray(HEADER_BYTES + item.host.numel())
        memoryview(buf)[HEADER_BYTES:] = item.host.numpy().reshape(-1)
        seal(item.kind, self.pool, buf, item.rows)
        item.done(bytes(buf))  # (the tiers keep immutable bytes)
