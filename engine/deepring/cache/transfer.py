"""A request's cache state out of one pool and into another, as self-checking byte records.

A request's state in a KVCachePool is
- per slot: every layer's window ring row and compressor tails (plain and indexer), and
- per block: every compressed layer's paged entries (and indexer keys) of its blocks, in the
  order of its block table.
Both are position-agnostic copies (rings and tails are indexed by position modulo their length,
entries by position within the request's own blocks), so the receiver can put them into any
free slot and any free blocks and continue exactly where the sender stopped.

One record holds the slot part or the block part. Format version 1, little-endian:

    header   magic b"DRKV" | format version u16 | kind u8 (1 slot, 2 blocks, 3 rings)
             | layout fingerprint 16 bytes | rows u32 | row_bytes u64 | crc32 of the payload u32
    payload  rows x row_bytes bytes: one row per slot or per block, each row the bytes of that
             slot's (block's) row of every pool tensor, concatenated in the pool's order

Block records are block-major, so one block's bytes are one contiguous row: the prefill ->
decode handoff carries a request's blocks in one record, and a persistent prefix-cache tier can
write and read single blocks with the same functions. The fingerprint names the layout (layer
kinds, widths, dtype), the block size and the ring length; a receiver whose pool differs refuses
the record instead of misreading it, and a damaged record fails its checksum.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from deepring.cache.pool import KVCachePool

MAGIC = b"DRKV"
FORMAT_VERSION = 2  # 2: CSA block edges (cache.pool)
KIND_SLOT = 1
KIND_BLOCKS = 2
KIND_RING = 3  # the window rings of a slot only (prefix-cache snapshots, see core.prefix)
_KIND_NAMES = {KIND_SLOT: "slot", KIND_BLOCKS: "block", KIND_RING: "ring"}
_HEADER = struct.Struct("<4sHB16sIQI")
HEADER_BYTES = _HEADER.size
# The fingerprint of a pool without tensors (zero-cost mode): records carry no bytes.
NO_TENSORS = b"\0" * 16

Buffer = bytes | bytearray | memoryview


class StateError(ValueError):
    """A record that does not fit this pool, or that was damaged on the way."""


class Header(NamedTuple):
    kind: int
    fingerprint: bytes
    rows: int
    row_bytes: int
    crc: int


@dataclass(frozen=True)
class CacheState:
    """A request's exported state: its slot record and its blocks' record."""

    slot_state: Buffer
    block_state: Buffer

    @property
    def num_blocks(self) -> int:
        return read_header(self.block_state, KIND_BLOCKS).rows


def fingerprint(pool: KVCachePool | None) -> bytes:
    """16 bytes naming the layout, block size and ring length of `pool`'s tensors."""
    if pool is None:
        return NO_TENSORS
    desc = f"{pool.layout.describe()}/b{pool.cache.block_size}/r{pool.ring_len}"
    return hashlib.sha256(desc.encode()).digest()[:16]


def read_header(buf: Buffer, kind: int) -> Header:
    """The header of a record of `kind`; StateError when `buf` is not one."""
    view = memoryview(buf)
    what = _KIND_NAMES[kind]
    if view.nbytes < HEADER_BYTES:
        raise StateError(f"{what} state has {view.nbytes} bytes, less than a header")
    magic, version, got_kind, fp, rows, row_bytes, crc = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise StateError(f"{what} state is not a cache state record")
    if version != FORMAT_VERSION:
        raise StateError(f"{what} state has format version {version} (this reads {FORMAT_VERSION})")
    if got_kind != kind:
        raise StateError(f"expected a {what} record, got kind {got_kind}")
    return Header(kind, fp, rows, row_bytes, crc)


def _row_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t[0].numel() * t.element_size() for t in tensors)


def _tensors(pool: KVCachePool | None, kind: int) -> list[torch.Tensor]:
    if pool is None:
        return []
    if kind == KIND_RING:
        return [lc.ring for lc in pool.layers]
    return pool.slot_tensors() if kind == KIND_SLOT else pool.block_tensors()


def _pack(kind: int, pool: KVCachePool | None, idx: list[int]) -> bytearray:
    tensors = _tensors(pool, kind)
    n, row_bytes = len(idx), _row_bytes(tensors)
    buf = bytearray(HEADER_BYTES + n * row_bytes)
    if n and row_bytes:
        out = torch.frombuffer(buf, dtype=torch.uint8, offset=HEADER_BYTES).view(n, row_bytes)
        if tensors[0].is_cuda:
            out.copy_(gather(kind, pool, idx))  # one device -> host copy, not one per tensor
        else:
            _gather_into(tensors, idx, out)  # straight into the record: no staging copy
    seal(kind, pool, buf, n)
    return buf


def _gather_into(tensors: list[torch.Tensor], idx: list[int], out: torch.Tensor) -> None:
    index = torch.tensor(idx, dtype=torch.long, device=tensors[0].device)
    col = 0
    with torch.inference_mode():
        for t in tensors:
            w = t[0].numel() * t.element_size()
            rows = t.index_select(0, index).reshape(len(idx), -1).view(torch.uint8)
            out[:, col : col + w].copy_(rows)
            col += w


def gather(kind: int, pool: KVCachePool | None, idx: list[int]) -> torch.Tensor:
    """The payload rows of a record of `kind` as one uint8 tensor [len(idx), row_bytes] on the
    pool's device: a snapshot taken in stream order (cache.staging copies it to the host while
    later steps run)."""
    tensors = _tensors(pool, kind)
    n, row_bytes = len(idx), _row_bytes(tensors)
    device = tensors[0].device if tensors else torch.device("cpu")
    out = torch.empty(n, row_bytes, dtype=torch.uint8, device=device)
    if n and row_bytes:
        _gather_into(tensors, idx, out)
    return out


def seal(kind: int, pool: KVCachePool | None, buf: bytearray, n: int) -> None:
    """Write the header of a record of `n` rows whose payload is already in `buf` after the
    header."""
    row_bytes = _row_bytes(_tensors(pool, kind))
    crc = zlib.crc32(memoryview(buf)[HEADER_BYTES:])
    _HEADER.pack_into(buf, 0, MAGIC, FORMAT_VERSION, kind, fingerprint(pool), n, row_bytes, crc)


def _checked(kind: int, buf: Buffer, pool: KVCachePool | None, n: int) -> memoryview:
    """The payload of a record of `kind` for `n` rows of `pool`; StateError when it does not
    fit or is damaged."""
    what = _KIND_NAMES[kind]
    head = read_header(buf, kind)
    if head.fingerprint != fingerprint(pool):
        raise StateError(f"the {what} state's layout does not match this pool")
    if head.rows != n:
        raise StateError(f"the {what} state carries {head.rows} rows, {n} allocated")
    row_bytes = _row_bytes(_tensors(pool, kind))
    payload = memoryview(buf)[HEADER_BYTES:]
    if head.row_bytes != row_bytes or payload.nbytes != n * row_bytes:
        raise StateError(
            f"{what} state has {payload.nbytes} payload bytes, expected {n * row_bytes}"
        )
    if zlib.crc32(payload) != head.crc:
        raise StateError(f"{what} state fails its checksum: damaged on the way")
    return payload


def _write(kind: int, payload: memoryview, pool: KVCachePool | None, idx: list[int]) -> None:
    tensors = _tensors(pool, kind)
    n, row_bytes = len(idx), _row_bytes(tensors)
    if not (n and row_bytes):
        return
    device = tensors[0].device
    if device.type == "cuda":
        # Pinned staging and one asynchronous host -> device copy: the host goes on at once and
        # the copy runs in stream order before the writes below (torch's pinned allocator keeps
        # the staging buffer alive until the copy has run).
        staged = torch.empty(n * row_bytes, dtype=torch.uint8, pin_memory=True)
        staged.numpy()[:] = np.frombuffer(payload, dtype=np.uint8)
        src = staged.to(device, non_blocking=True).view(n, row_bytes)
    else:
        # bytearray: a writable copy, which torch.frombuffer needs (received frames are
        # read-only).
        src = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(n, row_bytes)
    index = torch.tensor(idx, dtype=torch.long, device=device)
    col = 0
    with torch.inference_mode():
        for t in tensors:
            w = t[0].numel() * t.element_size()
            rows = src[:, col : col + w].contiguous().view(t.dtype).view(n, *t.shape[1:])
            t.index_copy_(0, index, rows)
            col += w


def export_slot(pool: KVCachePool | None, slot: int) -> bytearray:
    return _pack(KIND_SLOT, pool, [slot])


def export_blocks(pool: KVCachePool | None, blocks: list[int]) -> bytearray:
    return _pack(KIND_BLOCKS, pool, list(blocks))


def export_ring(pool: KVCachePool | None, slot: int) -> bytearray:
    """The window rings of `slot` (without its compressor tails)."""
    return _pack(KIND_RING, pool, [slot])


def import_ring(pool: KVCachePool | None, buf: Buffer, slot: int) -> None:
    _write(KIND_RING, _checked(KIND_RING, buf, pool, 1), pool, [slot])


def import_slot(pool: KVCachePool | None, buf: Buffer, slot: int) -> None:
    _write(KIND_SLOT, _checked(KIND_SLOT, buf, pool, 1), pool, [slot])


def import_blocks(pool: KVCachePool | None, buf: Buffer, blocks: list[int]) -> None:
    _write(KIND_BLOCKS, _checked(KIND_BLOCKS, buf, pool, len(blocks)), pool, list(blocks))


def export_state(pool: KVCachePool | None, slot: int, blocks: list[int]) -> CacheState:
    """Copy the state of the request in `slot` with block table `blocks` out of `pool`."""
    return CacheState(export_slot(pool, slot), export_blocks(pool, blocks))


def import_state(pool: KVCachePool | None, state: CacheState, slot: int, blocks: list[int]) -> None:
    """Write `state` into `pool` at `slot` and `blocks` (fresh allocations of the receiver).
    Both records are checked before anything is written; StateError when either does not fit."""
    slot_payload = _checked(KIND_SLOT, state.slot_state, pool, 1)
    block_payload = _checked(KIND_BLOCKS, state.block_state, pool, len(blocks))
    _write(KIND_SLOT, slot_payload, pool, [slot])
    _write(KIND_BLOCKS, block_payload, pool, list(blocks))
