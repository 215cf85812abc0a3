"""Decode attention on fp32 CPU tensors in one numba kernel (kernels.attention_decode dispatches).

The torch path runs about ten small ops per layer around its batched GEMMs, and a decode plan
per step; this kernel finds each row's keys (window ring, the new token, compressed entries)
from its position, block table and picks, and does the scores, the softmax with the sink and
the weighted sum for every head, with the rows shared out among threads (dispatch.run_rows).
Ad-hoc timing on the 2-core dev machine, 32 requests of the tiny model: a decode step 0.26 ms
shorter.
"""

from __future__ import annotations

import numpy as np
import torch

from deepring.kernels.dispatch import cpu_kernel, cpu_parallel_kernel, prange, run_rows

# Compressed keys: none (sliding window only), the row's picks (CSA), every causal entry (HCA).
_NO_COMP, _PICKS, _DENSE = 0, 1, 2
# Rows per thread below which the kernel does not split its rows (dispatch.run_rows).
_ROWS_PER_THREAD = 4


@cpu_kernel
def _check(positions, slots, n_slots, block_tables, n_blocks, epb, picks, mode, ratio):
    """What would make the kernel read outside its arrays (it does not check): 0 if nothing,
    1 a slot, 2 an entry beyond its block table, 3 a block id, 4 a negative position."""
    n_tables = block_tables.shape[1]
    for b in range(positions.shape[0]):
        if positions[b] < 0:
            return 4
        if slots[b] < 0 or slots[b] >= n_slots:
            return 1
        n = picks.shape[1] if mode == _PICKS else (positions[b] + 1) // ratio
        if mode == _NO_COMP:
            n = 0
        for c in range(n):
            e = picks[b, c] if mode == _PICKS else c
            if e < 0:
                continue
            if e // epb >= n_tables:
                return 2
            blk = block_tables[b, e // epb]
            if blk < 0 or blk >= n_blocks:
                return 3
    return 0


@cpu_kernel
def _decode_kernel(q, kv, ring, slots, positions, window, kv_in_ring, comp, block_tables, picks,
                   mode, ratio, sinks, scale, out):  # fmt: skip
    """out[b] = attention of q[b] [H, D] over row b's keys (K = V), with a sink logit per head.
    Ring index i holds the latest position p' = i (mod ring length) up to the row's position
    (kv_in_ring) or the one before (the new key is kv[b]); visible when p' > pos - window."""
    b_rows, heads, d = q.shape
    ring_len = ring.shape[1]
    epb = comp.shape[1]
    n_cap = 0
    if mode == _PICKS:
        n_cap = picks.shape[1]
    elif mode == _DENSE:
        for b in range(b_rows):
            n_cap = max(n_cap, (positions[b] + 1) // ratio)
    cap = ring_len + 1 + n_cap
    sc = np.empty((heads, cap), np.float32)
    rows = np.empty(cap, np.int64)  # each key's ring index or flat compressed row
    for b in range(b_rows):
        p = positions[b]
        slot = slots[b]
        last = p if kv_in_ring else p - 1
        j = 0
        for i in range(ring_len):
            ring_pos = last - (last - i) % ring_len
            if ring_pos >= 0 and ring_pos > p - window:
                rows[j] = i
                for h in range(heads):  # written out: a helper call ran 30% slower
                    acc = np.float32(0.0)
                    for t in range(d):
                        acc += q[b, h, t] * ring[slot, i, t]
                    sc[h, j] = acc * scale
                j += 1
        n_ring = j
        if not kv_in_ring:
            for h in range(heads):
                acc = np.float32(0.0)
                for t in range(d):
                    acc += q[b, h, t] * kv[b, t]
                sc[h, j] = acc * scale
            j += 1
        n_local = j
        if mode != _NO_COMP:
            n = picks.shape[1] if mode == _PICKS else (p + 1) // ratio
            for c in range(n):
                e = picks[b, c] if mode == _PICKS else c
                if e < 0:
                    continue
                blk, off = block_tables[b, e // epb], e % epb
                rows[j] = blk * epb + off
                for h in range(heads):
                    acc = np.float32(0.0)
                    for t in range(d):
                        acc += q[b, h, t] * comp[blk, off, t]
                    sc[h, j] = acc * scale
                j += 1
        n_keys = j
        for h in range(heads):
            top = sinks[h]
            for k in range(n_keys):
                top = max(top, sc[h, k])
            total = np.exp(sinks[h] - top)
            for k in range(n_keys):
                v = np.exp(sc[h, k] - top)
                sc[h, k] = v
                total += v
            inv = np.float32(1.0) / total
            for k in range(n_keys):
                sc[h, k] *= inv
            for t in range(d):
                out[b, h, t] = 0.0
        # One loop per key source, as above (a key chosen per iteration ran slower).
        for k in range(n_ring):
            i = rows[k]
            for h in range(heads):
                w = sc[h, k]
                for t in range(d):
                    out[b, h, t] += w * ring[slot, i, t]
        if not kv_in_ring:
            for h in range(heads):
                w = sc[h, n_ring]
                for t in range(d):
                    out[b, h, t] += w * kv[b, t]
        for k in range(n_local, n_keys):
            blk, off = rows[k] // epb, rows[k] % epb
            for h in range(heads):
                w = sc[h, k]
                for t in range(d):
                    out[b, h, t] += w * comp[blk, off, t]


@cpu_parallel_kernel
def _decode_rows(q, kv, ring, slots, positions, window, kv_in_ring, comp, block_tables, picks,
                 mode, ratio, sinks, scale, out, parts):  # fmt: skip
    """_decode_kernel on `parts` ranges of rows, in parallel."""
    n = q.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _decode_kernel(q[a:b], kv[a:b], ring, slots[a:b], positions[a:b], window, kv_in_ring,
                       comp, block_tables[a:b], picks[a:b], mode, ratio, sinks, scale,
                       out[a:b])  # fmt: skip


_ERRORS = {
    1: "a slot is outside the window rings",
    2: "a compressed entry lies beyond its block table",
    3: "a block id is outside the compressed cache",
    4: "a position is negative",
}


def decode_attention_numba(
    q: torch.Tensor,
    kv: torch.Tensor,
    ring: torch.Tensor,
    comp: torch.Tensor | None,
    positions: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    comp_idx: torch.Tensor | None,
    comp_ratio: int,
    sinks: torch.Tensor,
    scale: float,
    window: int,
    kv_in_ring: bool = False,
) -> torch.Tensor:
    """decode_attention_torch for fp32 CPU tensors (see numba_fits); kv_in_ring: the ring
    already holds each row's new token, and kv is not read."""
    b, _, d = q.shape
    mode = _NO_COMP if comp is None else (_PICKS if comp_idx is not None else _DENSE)
    comp_a = np.zeros((1, 1, d), np.float32) if comp is None else comp.numpy()
    picks = np.zeros((b, 0), np.int64) if comp_idx is None else comp_idx.contiguous().numpy()
    pos, sl = positions.contiguous().numpy(), slots.contiguous().numpy()
    tables = block_tables.contiguous().numpy()
    err = _check(pos, sl, ring.shape[0], tables, comp_a.shape[0], comp_a.shape[1], picks, mode,
                 comp_ratio)  # fmt: skip
    if err:
        raise IndexError(f"decode attention: {_ERRORS[err]}")
    out = torch.empty(q.shape, dtype=torch.float32)
    run_rows(
        _decode_kernel, _decode_rows, _ROWS_PER_THREAD, q.contiguous().numpy(),
        kv.contiguous().numpy(), ring.numpy(), sl, pos, window, kv_in_ring, comp_a, tables, picks,
        mode, comp_ratio, sinks.float().contiguous().numpy(), float(scale), out.numpy(),
    )  # fmt: skip
    return out


def numba_fits(q: torch.Tensor, ring: torch.Tensor, comp: torch.Tensor | None) -> bool:
    """Whether decode_attention_numba takes these: fp32 CPU query, ring and cache (contiguous:
    the kernel indexes them as they lie)."""
    tensors = [q, ring] if comp is None else [q, ring, comp]
    return (
        all(
            t.device.type == "cpu" and t.dtype == torch.float32 and not t.requires_grad
            for t in tensors
        )
        and ring.is_contiguous()
        and (comp is None or comp.is_contiguous())
    )
