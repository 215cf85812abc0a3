"""Moving a request's cache state from one worker's pool to another's (prefill -> decode).

A request's state in a KVCachePool is
- per slot: every layer's window ring row and compressor tails (plain and indexer), and
- per block: every compressed layer's paged entries (and indexer keys) of its blocks, in the
  order of its block table.
Both are position-agnostic copies (rings and tails are indexed by position modulo their length,
entries by position within the request's own blocks), so the receiver can put them into any
free slot and any free blocks and continue exactly where the sender stopped.

On the wire each part is one flat byte buffer: the tensors concatenated in `layout` order. The
layout fingerprint names the tensor shapes and dtypes; a receiver whose pool differs (another
model, dtype or block size) refuses the handoff instead of misreading it. The same-host default
copies through a ZeroMQ frame; a device-to-device transport would fill the same slots.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from deepring.cache.pool import KVCachePool

_SLOT_FIELDS = ("ring", "tail_kv", "tail_gate", "index_tail_kv", "index_tail_gate")
_BLOCK_FIELDS = ("comp", "index")
# Layout of a pool without tensors (zero-cost mode): nothing to move.
EMPTY_LAYOUT = "none"


@dataclass(frozen=True)
class CacheState:
    layout: str
    num_blocks: int
    slot_state: bytes | bytearray | memoryview
    block_state: bytes | bytearray | memoryview


def _slot_tensors(pool: KVCachePool) -> list[torch.Tensor]:
    return [
        t for lc in pool.layers for name in _SLOT_FIELDS if (t := getattr(lc, name)) is not None
    ]


def _block_tensors(pool: KVCachePool) -> list[torch.Tensor]:
    return [
        t for lc in pool.layers for name in _BLOCK_FIELDS if (t := getattr(lc, name)) is not None
    ]


def layout_of(pool: KVCachePool | None) -> str:
    """A fingerprint of the per-slot and per-block tensor layout of `pool`."""
    if pool is None:
        return EMPTY_LAYOUT
    desc = [("slot", str(t.dtype), tuple(t.shape[1:])) for t in _slot_tensors(pool)] + [
        ("block", str(t.dtype), tuple(t.shape[1:])) for t in _block_tensors(pool)
    ]
    desc.append(("block_size", pool.cache.block_size))
    return hashlib.sha256(repr(desc).encode()).hexdigest()[:16]


def _flat_bytes(parts: list[torch.Tensor]) -> memoryview:
    if not parts:
        return memoryview(b"")
    flat = torch.cat([p.reshape(-1).view(torch.uint8) for p in parts]).cpu()
    return memoryview(flat.numpy())


def export_state(pool: KVCachePool | None, slot: int, blocks: list[int]) -> CacheState:
    """Copy the state of the request in `slot` with block table `blocks` out of `pool`."""
    if pool is None:
        return CacheState(EMPTY_LAYOUT, len(blocks), b"", b"")
    with torch.inference_mode():
        slot_state = _flat_bytes([t[slot] for t in _slot_tensors(pool)])
        idx = torch.tensor(blocks, dtype=torch.long, device=pool.device)
        block_state = _flat_bytes([t.index_select(0, idx) for t in _block_tensors(pool)])
    return CacheState(layout_of(pool), len(blocks), slot_state, block_state)


def _expected_bytes(tensors: list[torch.Tensor], rows: int) -> int:
    return sum(t[0].numel() * t.element_size() * rows for t in tensors)


def import_state(pool: KVCachePool | None, state: CacheState, slot: int, blocks: list[int]) -> None:
    """Write `state` into `pool` at `slot` and `blocks` (fresh allocations of the receiver).

    Raises ValueError when the state does not fit this pool."""
    want = layout_of(pool)
    if state.layout != want:
        raise ValueError(f"handoff layout {state.layout!r} does not match this pool ({want!r})")
    if len(blocks) != state.num_blocks:
        raise ValueError(f"handoff carries {state.num_blocks} blocks, {len(blocks)} allocated")
    if pool is None:
        return
    slot_ts, block_ts = _slot_tensors(pool), _block_tensors(pool)
    for name, buf, tensors, rows in (
        ("slot", state.slot_state, slot_ts, 1),
        ("block", state.block_state, block_ts, len(blocks)),
    ):
        if memoryview(buf).nbytes != _expected_bytes(tensors, rows):
            raise ValueError(f"handoff {name} state has {memoryview(buf).nbytes} bytes")
    with torch.inference_mode():
        # bytearray: a writable copy, which torch.frombuffer needs (frames are read-only).
        src = torch.frombuffer(bytearray(state.slot_state), dtype=torch.uint8)
        pos = 0
        for t in slot_ts:
            n = t[0].numel() * t.element_size()
            t[slot] = src[pos : pos + n].view(t.dtype).view(t.shape[1:]).to(t.device)
            pos += n
        if blocks:
            src = torch.frombuffer(bytearray(state.block_state), dtype=torch.uint8)
            idx = torch.tensor(blocks, dtype=torch.long, device=pool.device)
            pos = 0
            for t in block_ts:
                n = t[0].numel() * t.element_size() * len(blocks)
                rows = src[pos : pos + n].view(t.dtype).view(len(blocks), *t.shape[1:])
                t.index_copy_(0, idx, rows.to(t.device))
                pos += n
