"""Decode attention: one new token per request over its window ring and compressed pages.

The new token's key is passed separately (`kv`), and the ring holds only earlier positions when
this runs: ring index i holds the latest position p' < pos with p' = i (mod ring_len), and it is
visible when p' > pos - window. The torch path can also take a ring that already holds the new
token (a plan made with kv_in_ring: p' <= pos), which saves it a key group; writing the ring
first is only safe in a pure decode step, where no row needs the positions it overwrites.
Compressed keys as in prefill attention. Sinks included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from deepring.kernels.attention_decode_numba import decode_attention_numba, numba_fits
from deepring.kernels.dispatch import (
    HAVE_TRITON,
    cpu_kernel,
    next_pow2,
    use_numba,
    use_numba_plan,
    use_triton,
)
from deepring.kernels.gather import paged_rows, take_entries


@dataclass
class DecodePlan:
    """What the torch path needs that depends on the batch but not on the layer, so a step
    builds it once for all layers of the same shape (a decode step is a few hundred tiny ops;
    these were a third of attention's)."""

    ring_rows: torch.Tensor | tuple[int, int]  # slot per request, or (first, n) if consecutive
    hidden: torch.Tensor  # [B, 1, ring_len (+ 1) (+ N dense entries)] bool: key not visible
    dense_rows: torch.Tensor | None  # [B, N] flat cache rows of the dense entries (paged_rows)
    kv_in_ring: bool = False  # the ring holds the new token (no separate key group)


def decode_plan(
    positions: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    ring_len: int,
    window: int,
    dense: tuple[int, int] | None,
    kv_in_ring: bool = False,
) -> DecodePlan:
    """dense: (comp_ratio, entries per block) when every causal compressed entry is attended
    (HCA); None without compressed entries or with a per-row top-k (CSA). kv_in_ring: the ring
    already holds each request's new token."""
    if use_numba_plan(positions):
        return _decode_plan_numba(
            positions, slots, block_tables, ring_len, window, dense, kv_in_ring
        )
    b = positions.shape[0]
    p = positions[:, None]
    i = torch.arange(ring_len, device=positions.device)
    last = p if kv_in_ring else p - 1  # the newest position the ring holds
    ring_pos = last - torch.remainder(last - i, ring_len)
    visible = [(ring_pos >= 0) & (ring_pos > p - window)]
    if not kv_in_ring:
        visible.append(torch.ones_like(p, dtype=torch.bool))  # the new token, passed apart
    dense_rows = None
    if dense is not None:
        ratio, epb = dense
        n = (positions + 1) // ratio
        e = torch.arange(int(n.max()) if b else 0, device=positions.device)
        dense_rows = paged_rows(block_tables, e, epb)
        visible.append(e < n[:, None])
    hidden = ~torch.cat(visible, 1)[:, None, :]
    first = int(slots[0]) if b else 0
    consecutive = b == 1 or (b > 0 and bool((slots.diff() == 1).all()))
    return DecodePlan((first, b) if consecutive else slots, hidden, dense_rows, kv_in_ring)


@cpu_kernel
def _decode_plan_kernel(positions, slots, ring_len, window, kv_in_ring, ratio, block_tables,
                        epb, hidden, dense_rows):  # fmt: skip
    """decode_plan's mask and dense rows in one pass; returns whether the slots are
    consecutive."""
    b = positions.shape[0]
    n_dense = dense_rows.shape[1]
    consecutive = True
    for r in range(b):
        p = positions[r]
        last = p if kv_in_ring else p - 1
        for i in range(ring_len):
            ring_pos = last - (last - i) % ring_len
            hidden[r, 0, i] = not (ring_pos >= 0 and ring_pos > p - window)
        col = ring_len
        if not kv_in_ring:
            hidden[r, 0, col] = False
            col += 1
        n = (p + 1) // ratio
        for e in range(n_dense):
            hidden[r, 0, col + e] = e >= n
            j = e // epb
            if j >= block_tables.shape[1]:
                raise IndexError("decode plan: an entry lies beyond the block table")
            dense_rows[r, e] = block_tables[r, j] * epb + e % epb
        if r and slots[r] != slots[r - 1] + 1:
            consecutive = False
    return consecutive


def _decode_plan_numba(
    positions: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    ring_len: int,
    window: int,
    dense: tuple[int, int] | None,
    kv_in_ring: bool,
) -> DecodePlan:
    """decode_plan on CPU in one kernel call instead of about fifteen tiny ops."""
    b = positions.shape[0]
    ratio, epb = dense if dense is not None else (1, 1)
    pos = positions.contiguous()
    n_dense = int(pos.max() + 1) // ratio if dense is not None and b else 0
    width = ring_len + (0 if kv_in_ring else 1) + n_dense
    hidden = torch.empty(b, 1, width, dtype=torch.bool)
    dense_rows = torch.empty(b, n_dense, dtype=torch.long)
    consecutive = _decode_plan_kernel(
        pos.numpy(), slots.contiguous().numpy(), ring_len, window, kv_in_ring, ratio,
        block_tables.contiguous().numpy(), epb, hidden.numpy(), dense_rows.numpy(),
    )  # fmt: skip
    first = int(slots[0]) if b else 0
    rows = (first, b) if b == 1 or (b > 0 and consecutive) else slots
    return DecodePlan(rows, hidden, dense_rows if dense is not None else None, kv_in_ring)


def decode_attention_torch(
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
    plan: DecodePlan | None = None,
    kv_in_ring: bool = False,
) -> torch.Tensor:
    """q: [B, H, D]; kv: [B, D]; positions/slots: [B]; comp_idx: [B, K] or None. `plan`: what
    decode_plan gives for these positions, slots and tables; when not given, it is built here
    with kv_in_ring (a given plan carries its own)."""
    b, h, _ = q.shape
    if plan is None:
        dense = (comp_ratio, comp.shape[1]) if comp is not None and comp_idx is None else None
        plan = decode_plan(positions, slots, block_tables, ring.shape[1], window, dense, kv_in_ring)
    f32 = torch.float32
    rows = plan.ring_rows
    # Key groups are scored and summed one by one rather than concatenated: the scores are a
    # small fraction of the keys' size, so nothing key-sized is copied (the ring not at all
    # when the slots are consecutive).
    groups = [
        ring[rows[0] : rows[0] + rows[1]] if isinstance(rows, tuple) else ring.index_select(0, rows)
    ]
    if not plan.kv_in_ring:
        groups.append(kv[:, None])
    hidden = plan.hidden
    if comp is not None and comp_idx is not None:
        groups.append(
            take_entries(comp, paged_rows(block_tables, comp_idx.clamp(min=0), comp.shape[1]))
        )
        hidden = torch.cat([hidden, (comp_idx < 0)[:, None, :]], -1)
    elif comp is not None:
        groups.append(take_entries(comp, plan.dense_rows))
    groups = [g if g.dtype == f32 else g.float() for g in groups]
    qs = q.float() * scale
    # The sink is one more logit in the softmax, with no value attached.
    sink = (sinks if sinks.dtype == f32 else sinks.float()).view(1, h, 1).expand(b, h, 1)
    # bmm rather than einsum: at decode sizes einsum's planning costs more than the GEMM on CPU.
    sc = torch.cat([torch.bmm(qs, g.transpose(1, 2)) for g in groups] + [sink], -1)
    sc[..., :-1].masked_fill_(hidden, float("-inf"))
    prob = torch.softmax(sc, -1)
    out = torch.bmm(prob[..., : groups[0].shape[1]], groups[0])
    at = groups[0].shape[1]
    for g in groups[1:]:
        out.baddbmm_(prob[..., at : at + g.shape[1]], g)
        at += g.shape[1]
    return out if out.dtype == q.dtype else out.to(q.dtype)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _attend(q, k, valid, m_i, l_i, acc, scale, PREC: tl.constexpr):
        sc = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        sc = tl.where(valid[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k, input_precision=PREC)
        return m_new, l_i, acc

    @triton.jit
    def _decode_attn_kernel(
        q_ptr, kv_ptr, ring_ptr, comp_ptr, out_ptr, sinks_ptr, pos_ptr, slots_ptr, bt_ptr, idx_ptr,
        H, D, RING, EPB, RATIO, K_IDX, WINDOW, scale,
        stride_qb, stride_qh, stride_kv, stride_ring_s, stride_ring_r, stride_comp_b,
        stride_comp_e, stride_ob, stride_oh, stride_bt, stride_idx,
        HAS_COMP: tl.constexpr, HAS_IDX: tl.constexpr, PREC: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        hmask = heads < H
        dcols = tl.arange(0, BLOCK_D)
        dmask = dcols < D
        pos = tl.load(pos_ptr + b)
        slot = tl.load(slots_ptr + b)
        q = tl.load(
            q_ptr + b * stride_qb + heads[:, None] * stride_qh + dcols[None, :],
            mask=hmask[:, None] & dmask[None, :], other=0.0,
        )  # fmt: skip
        m_i = tl.load(sinks_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
        l_i = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        # Ring: the window's earlier positions pos-window+1 .. pos-1.
        lo = tl.maximum(pos - WINDOW + 1, 0)
        for kstart in range(0, WINDOW, BLOCK_N):
            kpos = lo + kstart + tl.arange(0, BLOCK_N)
            valid = kpos < pos
            kptr = ring_ptr + slot * stride_ring_s + (kpos % RING) * stride_ring_r
            k = tl.load(
                kptr[:, None] + dcols[None, :], mask=valid[:, None] & dmask[None, :], other=0.0
            )
            m_i, l_i, acc = _attend(q, k, valid, m_i, l_i, acc, scale, PREC)
        # The new token itself (one valid key in a padded tile: tl.dot needs 16 rows).
        j = tl.arange(0, 16)
        valid = j == 0
        k = tl.load(
            kv_ptr + b * stride_kv + j[:, None] * 0 + dcols[None, :],
            mask=valid[:, None] & dmask[None, :], other=0.0,
        )  # fmt: skip
        m_i, l_i, acc = _attend(q, k, valid, m_i, l_i, acc, scale, PREC)
        if HAS_COMP:
            n_keys = K_IDX if HAS_IDX else (pos + 1) // RATIO
            for kstart in range(0, n_keys, BLOCK_N):
                jj = kstart + tl.arange(0, BLOCK_N)
                jm = jj < n_keys
                if HAS_IDX:
                    e = tl.load(idx_ptr + b * stride_idx + jj, mask=jm, other=-1).to(tl.int64)
                    valid = jm & (e >= 0)
                else:
                    e = jj.to(tl.int64)
                    valid = jm
                e = tl.where(valid, e, 0)
                blk = tl.load(bt_ptr + b * stride_bt + e // EPB, mask=valid, other=0)
                kptr = comp_ptr + blk * stride_comp_b + (e % EPB) * stride_comp_e
                k = tl.load(
                    kptr[:, None] + dcols[None, :], mask=valid[:, None] & dmask[None, :], other=0.0
                )
                m_i, l_i, acc = _attend(q, k, valid, m_i, l_i, acc, scale, PREC)
        o = acc / l_i[:, None]
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + dcols[None, :],
            o.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & dmask[None, :],
        )  # fmt: skip


def decode_attention_triton(
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
    block_n: int = 32,
) -> torch.Tensor:
    b, h, d = q.shape
    if q.stride(-1) != 1 or kv.stride(-1) != 1 or ring.stride(-1) != 1:
        raise ValueError("attention inputs need a contiguous last dimension")
    out = torch.empty_like(q)
    if b == 0:
        return out
    block_h = max(16, min(next_pow2(h), 64))
    comp_t = comp if comp is not None else ring
    idx = comp_idx if comp_idx is not None else positions
    _decode_attn_kernel[(b, triton.cdiv(h, block_h))](
        q, kv, ring, comp_t, out, sinks, positions, slots, block_tables, idx,
        h, d, ring.shape[1], comp_t.shape[1], max(comp_ratio, 1),
        comp_idx.shape[1] if comp_idx is not None else 0, window, float(scale),
        q.stride(0), q.stride(1), kv.stride(0), ring.stride(0), ring.stride(1),
        comp_t.stride(0), comp_t.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), idx.stride(0) if comp_idx is not None else 0,
        HAS_COMP=comp is not None, HAS_IDX=comp_idx is not None,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(d)),
    )  # fmt: skip
    return out


def decode_attention(
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
    plan: DecodePlan | Callable[[], DecodePlan] | None = None,
    kv_in_ring: bool = False,
) -> torch.Tensor:
    """kv_in_ring: the ring already holds each row's new token (torch and numba paths only).
    `plan` (torch path only): decode_plan's result for this batch, shared across layers, or
    what makes it (the other paths do not need it)."""
    args = (q, kv, ring, comp, positions, slots, block_tables, comp_idx, comp_ratio, sinks)
    if use_triton(q):
        if kv_in_ring:
            raise ValueError("decode attention: the Triton kernel reads the new token from kv")
        return decode_attention_triton(*args, scale, window)
    if use_numba(q) and numba_fits(q, ring, comp):
        return decode_attention_numba(*args, scale, window, kv_in_ring)
    if callable(plan):
        plan = plan()
    if plan is not None and plan.kv_in_ring != kv_in_ring:
        raise ValueError("decode attention: the plan and kv_in_ring disagree")
    return decode_attention_torch(*args, scale, window, plan, kv_in_ring)
