"""Prefill attention: each query row sees its sliding window plus a set of compressed entries.

Window keys come from two places: positions before the chunk from the request's ring
(`ring[slot, pos % ring_len]`), positions inside the chunk from this step's `kv`. Compressed
keys come from the paged cache (`comp[block, entry % entries_per_block]`), either the entries
listed in `comp_idx` (CSA top-k, -1 = none) or every causal entry e < (pos + 1) // ratio (HCA).
K = V (shared single-head MQA); each head has a sink logit in the softmax denominator.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from deepring.kernels.dispatch import HAVE_TRITON, next_pow2, use_triton
from deepring.kernels.gather import paged_rows, take_entries, take_rows


@dataclass
class SeqLayout:
    """Where each request of a batch sits. Python lists for loops, tensors for kernels."""

    offsets: list[int]  # first row of each request in the flat token axis
    lens: list[int]  # rows of each request in this step
    starts: list[int]  # position of each request's first row (= tokens already cached)
    slots: torch.Tensor  # [S] int64 state slot (ring, compressor tails)
    block_tables: torch.Tensor  # [S, max_blocks] int64, padded with 0
    token_seq: torch.Tensor  # [T] int64 request index of each row
    positions: torch.Tensor  # [T] int64 absolute position of each row
    starts_t: torch.Tensor  # [S] int64
    offsets_t: torch.Tensor  # [S] int64
    # Per request, the first position whose window key exists (prefix-cache replay: the
    # chunk's start; 0 otherwise). None when every request's is 0.
    window_floors: list[int] | None = None
    window_floors_t: torch.Tensor | None = None

    def floor(self, s: int) -> int:
        return self.window_floors[s] if self.window_floors is not None else 0

    def subset(self, seqs: list[int]) -> SeqLayout:
        """The layout of some requests only (row indices stay global)."""
        idx = torch.tensor(seqs, dtype=torch.long, device=self.slots.device)
        return SeqLayout(
            offsets=[self.offsets[i] for i in seqs],
            lens=[self.lens[i] for i in seqs],
            starts=[self.starts[i] for i in seqs],
            slots=self.slots[idx],
            block_tables=self.block_tables[idx],
            token_seq=self.token_seq,
            positions=self.positions,
            starts_t=self.starts_t[idx],
            offsets_t=self.offsets_t[idx],
            window_floors=None
            if self.window_floors is None
            else [self.window_floors[i] for i in seqs],
            window_floors_t=None if self.window_floors_t is None else self.window_floors_t[idx],
        )


def _attend_rows(
    q: torch.Tensor, k: torch.Tensor, hidden: torch.Tensor, sinks: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [S, L, H, D]; k (= v): [S, N + 1, D] whose last row is zeros, the sink's slot;
    hidden: [S or 1, L, N + 1] bool, True where a row must not see a key (the last column
    False). Softmax with a per-head sink logit."""
    s, n_rows, h, d = q.shape
    # The scale goes on q, not on the scores: fewer elements (D < keys).
    qs = (q * scale).reshape(s, n_rows * h, d)
    sc = torch.bmm(qs, k.transpose(1, 2)).view(s, n_rows, h, -1)
    sc.masked_fill_(hidden[:, :, None, :], float("-inf"))
    # The sink is one more logit, in the zero key's column: it joins the denominator only.
    # torch.softmax rather than exp_ by hand: ATen's exp_ takes a scalar path on inputs below
    # about -88, -inf included, and was the largest single op of CPU prefill (ad-hoc, 650k
    # scores with 40% masked: 3.2 ms for exp_ alone against 0.4 ms for the whole softmax).
    sc[..., -1] = sinks
    p = torch.softmax(sc, -1)
    return torch.bmm(p.view(s, n_rows * h, -1), k).view(s, n_rows, h, d)


def _flash_cpu_op():
    """ATen's fused CPU attention (flash-style: scores never leave the cache), or None."""
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):
        return None


_FLASH_CPU = _flash_cpu_op()


def _attend_rows_flash(
    q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, sinks: torch.Tensor, scale: float
) -> torch.Tensor:
    """_attend_rows through ATen's fused CPU attention: q [S, L, H, D]; k (= v) [S, N, D];
    bias [S or 1, L, N] fp32, -inf where a row must not see a key and 0 elsewhere. The fused
    kernel has no sink, but returns each row's log-sum-exp `lse` of the scores, and a sink
    logit z scales the sinkless output by e^lse / (e^lse + e^z) = sigmoid(lse - z). A row that
    sees no key (none does: each sees itself) gets 0, as with the sink alone. Ad-hoc timing on
    the 2-core dev machine, 8 requests x 64 rows x 4 heads against 320 keys: 1.1 ms against
    2.7 ms for _attend_rows, which makes four passes over the scores in memory."""
    s, _, h, d = q.shape
    kh = k[:, None].expand(s, h, -1, d)  # one shared key head: a stride-0 view, not a copy
    out, lse = _FLASH_CPU(
        q.transpose(1, 2), kh, kh, 0.0, False, attn_mask=bias[:, None], scale=scale
    )  # out [S, H, L, D] (a transposed view of [S, L, H, D]), lse [S, H, L]
    out.mul_(torch.sigmoid(lse - sinks[None, :, None])[..., None])
    return out.transpose(1, 2)


# Masks depend on a block's shape only, which repeats across blocks, layers and steps; cached
# (read-only tensors) because building one costs several small ops each time. With bias=True
# they are fp32 additive masks (-inf hidden, 0 seen) for _attend_rows_flash, else bool
# (True = hidden) for _attend_rows.
def _as_bias(hidden: torch.Tensor) -> torch.Tensor:
    return torch.zeros(hidden.shape, device=hidden.device).masked_fill_(hidden, float("-inf"))


@functools.lru_cache(maxsize=256)
def _band_hidden(
    rows: int, keys: int, base: int, window: int, dev: torch.device, bias: bool = False
) -> torch.Tensor:
    """[1, rows, keys]: hidden where not 0 <= base + i - j < window."""
    delta = base + torch.arange(rows, device=dev)[:, None] - torch.arange(keys, device=dev)
    hidden = ((delta < 0) | (delta >= window))[None]
    return _as_bias(hidden) if bias else hidden


@functools.lru_cache(maxsize=256)
def _late_entries(
    pos0: int, rows: int, n: int, ratio: int, dev: torch.device, bias: bool = False
) -> torch.Tensor:
    """[1, rows, n]: entry e is not complete yet for the row at position pos0 + i."""
    seen = (torch.arange(pos0, pos0 + rows, device=dev) + 1) // ratio
    hidden = (torch.arange(n, device=dev)[None] >= seen[:, None])[None]
    return _as_bias(hidden) if bias else hidden


@functools.lru_cache(maxsize=64)
def _sink_column(rows: int, dev: torch.device) -> torch.Tensor:
    return torch.zeros(1, rows, 1, dtype=torch.bool, device=dev)


def _rows_of(x: torch.Tensor, offsets: list[int], n: int) -> torch.Tensor:
    """x[a : a + n] for each offset a, stacked: [S, n, ...]; a view when they are adjacent."""
    a0 = offsets[0]
    if all(a == a0 + i * n for i, a in enumerate(offsets)):
        return x[a0 : a0 + len(offsets) * n].unflatten(0, (len(offsets), n))
    return torch.stack([x[a : a + n] for a in offsets])


def prefill_attention_torch(
    q: torch.Tensor,
    kv: torch.Tensor,
    ring: torch.Tensor,
    comp: torch.Tensor | None,
    layout: SeqLayout,
    comp_idx: torch.Tensor | None,
    comp_ratio: int,
    sinks: torch.Tensor,
    scale: float,
    window: int,
    block_q: int = 64,
    flash: bool | None = None,
) -> torch.Tensor:
    """Rows are processed in blocks of `block_q` queries, each against only the window keys it
    can see, so work and memory grow with rows x (block_q + window), not rows^2. Requests with
    the same start and length (a batch of equal prompts) run together as one batched GEMM.
    flash: whether blocks run through ATen's fused CPU attention (_attend_rows_flash) rather
    than GEMMs + softmax (_attend_rows); by default where it exists and q is on the CPU."""
    if flash is None:
        flash = _FLASH_CPU is not None and q.device.type == "cpu"
    out = torch.empty_like(q)
    groups: dict[tuple[int, int, int], list[int]] = {}
    for s, (n_rows, p0) in enumerate(zip(layout.lens, layout.starts, strict=True)):
        groups.setdefault((p0, n_rows, layout.floor(s)), []).append(s)
    sinks = sinks.float()

    def attend_group(
        seqs: list[int], offsets: list[int], p0: int, n_rows: int, floor: int
    ) -> torch.Tensor:
        """Attention of S requests that each have n_rows rows from position p0, whose window
        keys exist from position `floor` on: [S, n_rows, H, D]."""
        dev = q.device
        sel = torch.tensor(seqs, device=dev)
        nh = max(0, min(p0 - floor, window - 1))
        keys = _rows_of(kv, offsets, n_rows)
        if nh:
            hist_pos = torch.arange(p0 - nh, p0, device=dev) % ring.shape[1]
            ring_rows = layout.slots.index_select(0, sel)[:, None] * ring.shape[1] + hist_pos
            keys = torch.cat([take_rows(ring.view(-1, ring.shape[-1]), ring_rows), keys], 1)
        keys = keys.float()
        ck = hide_all = None
        if comp is not None:
            n = (p0 + n_rows) // comp_ratio
            tables = layout.block_tables.index_select(0, sel)
            rows = paged_rows(tables, torch.arange(n, device=dev), comp.shape[1])
            ck = take_entries(comp, rows).float()  # [S, n, D]
            if comp_idx is not None:
                picks = _rows_of(comp_idx, offsets, n_rows)
                shape = (len(seqs), n_rows, n + 1)
                hide_all = (
                    torch.full(shape, float("-inf"), device=dev)
                    if flash
                    else torch.ones(shape, dtype=torch.bool, device=dev)
                )
                hide_all.scatter_(2, torch.where(picks >= 0, picks, n), 0.0 if flash else False)
        qf = _rows_of(q, offsets, n_rows).float()
        res = torch.empty_like(qf)
        # The sink's key (see _attend_rows); the flash path applies the sink apart.
        zero = None if flash else keys.new_zeros(len(seqs), 1, keys.shape[-1])
        for b0 in range(0, n_rows, block_q):
            b1 = min(n_rows, b0 + block_q)
            k_lo = max(0, nh + b0 - (window - 1))  # first window key any row of the block sees
            k = [keys[:, k_lo : nh + b1]]
            # Row i sees window key j when 0 <= (b0 + nh - k_lo) + i - j < window.
            hidden = [_band_hidden(b1 - b0, k[0].shape[1], b0 + nh - k_lo, window, dev, flash)]
            if ck is not None:
                nb = (p0 + b1) // comp_ratio  # entries any row of the block may see
                if hide_all is not None:
                    hidden.append(hide_all[:, b0:b1, :nb])
                    hidden[0] = hidden[0].expand(len(seqs), -1, -1)
                else:
                    hidden.append(_late_entries(p0 + b0, b1 - b0, nb, comp_ratio, dev, flash))
                k.append(ck[:, :nb])
            if flash:
                res[:, b0:b1] = _attend_rows_flash(
                    qf[:, b0:b1], torch.cat(k, 1), torch.cat(hidden, 2), sinks, scale
                )
                continue
            sink = _sink_column(b1 - b0, dev).expand(hidden[0].shape[0], -1, -1)
            res[:, b0:b1] = _attend_rows(
                qf[:, b0:b1], torch.cat([*k, zero], 1), torch.cat([*hidden, sink], 2), sinks, scale
            )
        return res.to(q.dtype)

    for (p0, n_rows, floor), seqs in groups.items():
        offsets = [layout.offsets[s] for s in seqs]
        for a, rows in zip(offsets, attend_group(seqs, offsets, p0, n_rows, floor), strict=True):
            out[a : a + n_rows] = rows
    return out


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _prefill_attn_kernel(
        q_ptr, kv_ptr, ring_ptr, comp_ptr, out_ptr, sinks_ptr,
        token_seq_ptr, pos_ptr, starts_ptr, offsets_ptr, slots_ptr, bt_ptr, idx_ptr, floors_ptr,
        H, D, RING, EPB, RATIO, K_IDX, WINDOW, scale,
        stride_qt, stride_qh, stride_kv, stride_ring_s, stride_ring_r, stride_comp_b,
        stride_comp_e, stride_ot, stride_oh, stride_bt, stride_idx,
        HAS_COMP: tl.constexpr, HAS_IDX: tl.constexpr, HAS_FLOOR: tl.constexpr,
        PREC: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        hb = tl.program_id(1)
        heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        hmask = heads < H
        dcols = tl.arange(0, BLOCK_D)
        dmask = dcols < D
        s = tl.load(token_seq_ptr + row)
        pos = tl.load(pos_ptr + row)
        start = tl.load(starts_ptr + s)
        off = tl.load(offsets_ptr + s)
        slot = tl.load(slots_ptr + s)
        q = tl.load(
            q_ptr + row * stride_qt + heads[:, None] * stride_qh + dcols[None, :],
            mask=hmask[:, None] & dmask[None, :], other=0.0,
        )  # fmt: skip
        m_i = tl.load(sinks_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
        l_i = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        lo = tl.maximum(pos - WINDOW + 1, 0)
        if HAS_FLOOR:  # prefix-cache replay: no window key before the request's floor
            lo = tl.maximum(lo, tl.load(floors_ptr + s))
        # Sliding window: positions lo..pos, older ones from the ring, the rest from this chunk.
        for kstart in range(0, WINDOW, BLOCK_N):
            kpos = lo + kstart + tl.arange(0, BLOCK_N)
            valid = kpos <= pos
            hist = kpos < start
            rptr = ring_ptr + slot * stride_ring_s + (kpos % RING) * stride_ring_r
            cptr = kv_ptr + (off + kpos - start) * stride_kv
            k = tl.load(
                rptr[:, None] + dcols[None, :], mask=(valid & hist)[:, None] & dmask[None, :],
                other=0.0,
            ) + tl.load(
                cptr[:, None] + dcols[None, :], mask=(valid & ~hist)[:, None] & dmask[None, :],
                other=0.0,
            )  # fmt: skip
            sc = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
            sc = tl.where(valid[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k, input_precision=PREC)
            m_i = m_new
        if HAS_COMP:
            n_keys = K_IDX if HAS_IDX else (pos + 1) // RATIO
            for kstart in range(0, n_keys, BLOCK_N):
                j = kstart + tl.arange(0, BLOCK_N)
                jm = j < n_keys
                if HAS_IDX:
                    e = tl.load(idx_ptr + row * stride_idx + j, mask=jm, other=-1).to(tl.int64)
                    valid = jm & (e >= 0)
                else:
                    e = j.to(tl.int64)
                    valid = jm
                e = tl.where(valid, e, 0)
                blk = tl.load(bt_ptr + s * stride_bt + e // EPB, mask=valid, other=0)
                kptr = comp_ptr + blk * stride_comp_b + (e % EPB) * stride_comp_e
                k = tl.load(
                    kptr[:, None] + dcols[None, :], mask=valid[:, None] & dmask[None, :], other=0.0
                )
                sc = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
                sc = tl.where(valid[None, :], sc, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(sc, axis=1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(sc - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k, input_precision=PREC)
                m_i = m_new
        o = acc / l_i[:, None]
        tl.store(
            out_ptr + row * stride_ot + heads[:, None] * stride_oh + dcols[None, :],
            o.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & dmask[None, :],
        )  # fmt: skip


def prefill_attention_triton(
    q: torch.Tensor,
    kv: torch.Tensor,
    ring: torch.Tensor,
    comp: torch.Tensor | None,
    layout: SeqLayout,
    comp_idx: torch.Tensor | None,
    comp_ratio: int,
    sinks: torch.Tensor,
    scale: float,
    window: int,
    block_n: int = 32,
) -> torch.Tensor:
    t, h, d = q.shape
    if q.stride(-1) != 1 or kv.stride(-1) != 1 or ring.stride(-1) != 1:
        raise ValueError("attention inputs need a contiguous last dimension")
    out = torch.empty_like(q)
    if t == 0:
        return out
    block_h = max(16, min(next_pow2(h), 64))
    has_comp = comp is not None
    comp_t = comp if has_comp else ring
    idx = comp_idx if comp_idx is not None else layout.positions
    starts = layout.starts_t
    grid = (t, triton.cdiv(h, block_h))
    _prefill_attn_kernel[grid](
        q, kv, ring, comp_t, out, sinks, layout.token_seq, layout.positions, starts,
        layout.offsets_t, layout.slots, layout.block_tables, idx,
        layout.window_floors_t if layout.window_floors_t is not None else starts,
        h, d, ring.shape[1], comp_t.shape[1], max(comp_ratio, 1),
        comp_idx.shape[1] if comp_idx is not None else 0, window, float(scale),
        q.stride(0), q.stride(1), kv.stride(0), ring.stride(0), ring.stride(1),
        comp_t.stride(0), comp_t.stride(1), out.stride(0), out.stride(1),
        layout.block_tables.stride(0), idx.stride(0) if comp_idx is not None else 0,
        HAS_COMP=has_comp, HAS_IDX=comp_idx is not None,
        HAS_FLOOR=layout.window_floors_t is not None,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(d)),
    )  # fmt: skip
    return out


def prefill_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    ring: torch.Tensor,
    comp: torch.Tensor | None,
    layout: SeqLayout,
    comp_idx: torch.Tensor | None,
    comp_ratio: int,
    sinks: torch.Tensor,
    scale: float,
    window: int,
) -> torch.Tensor:
    fn = prefill_attention_triton if use_triton(q) else prefill_attention_torch
    return fn(q, kv, ring, comp, layout, comp_idx, comp_ratio, sinks, scale, window)
