"""One forward step over a batch of requests, each contributing a chunk of consecutive tokens.

A decode step is the special case of one token per request; prefill chunks may start at any
position. Everything that depends only on the batch shape (RoPE angles, which compressed entries
each request completes this step, where rows are gathered from and written to) is computed once
here and shared by every layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from deepring.kernels.attention_prefill import SeqLayout
from deepring.kernels.rope import broadcast_cis
from deepring.model.rope import RopeTables

T = TypeVar("T")


@dataclass
class SeqChunk:
    """One request's part of a step."""

    token_ids: list[int]
    start: int  # position of token_ids[0] (= tokens of this request already in the cache)
    slot: int  # state slot: window ring and compressor tails
    block_ids: list[int]  # paged-cache blocks covering positions [0, start + len)
    logits: str = "last"  # "last" | "all" | "none": which rows' logits the step returns
    # Prefix-cache replay (core.prefix): the first position whose window key exists; the
    # ring's earlier positions are never read (they were not computed here). A chunk with a
    # floor needs >= 2 tokens (single rows take the decode kernels, which have no floor).
    window_floor: int = 0
    # Positions below this already have their compressed entries, compressor tail and block
    # edges in the cache (a prefix hit): their rows pool no entry and write no tail or edge
    # (the blocks holding them are shared, and must never be rewritten).
    compress_from: int = 0
    # The tokens just before `start` (the last of them; V4.1's Engram reads up to
    # model.token_context of them). V4 never reads it.
    context: list[int] = field(default_factory=list)
    # V4.1's decoder SWA bounded replay: the first position the decoder layers compute (the
    # prompt's last KEEP tokens; rows before it stop at the encoder). V4 never reads it.
    decoder_from: int = 0
    # V4.1 images: (row in token_ids, embeddings [k, hidden]) for the rows of image spans in
    # this chunk (their ids are model.v41.vision's span ids, outside the vocabulary); the
    # embedding layer takes these instead. V4 refuses them.
    embeds: list = field(default_factory=list)


@dataclass
class CompressPlan:
    """Where the rows of each compressed entry completed this step come from and go to."""

    entry_seq: torch.Tensor  # [E] request index
    from_chunk: torch.Tensor  # [E, R] bool: row is in this step's chunk (else in the tail state)
    chunk_row: torch.Tensor  # [E, R] row index into the step's tokens (clamped)
    state_row: torch.Tensor  # [E, R] row index into the flattened tail state (clamped)
    valid: torch.Tensor  # [E, R] bool: position >= 0
    dest: torch.Tensor  # [E] flat index into the paged cache viewed as [blocks * epb, dim]
    rope_pos: torch.Tensor  # [E] position of the entry's first token
    keep_rows: torch.Tensor | slice  # [K] step rows to remember in the tail state (or all)
    keep_dest: torch.Tensor  # [K] their flat index in the tail state
    chunk_only: bool  # no valid row comes from the tail state (e.g. a prefill from 0)
    # [E, R] each row's place in the tail state viewed as [-1, hd] (CSA: the half of the tail
    # row that the overlapping window pools; HCA: the tail row).
    tail_row: torch.Tensor
    all_valid: bool  # every row is at a position >= 0


@dataclass
class EdgePlan:
    """Rows this step writes into their block's edge (the Ca half of a CSA compressor's last
    `ratio` rows of each block: the state a prefix hit at the next block needs, see
    cache.pool). Empty on most decode steps."""

    rows: torch.Tensor  # [N] step row
    dest: torch.Tensor  # [N] flat index into edge tensors viewed as [blocks * ratio, dim]


@dataclass
class ForwardBatch:
    chunks: list[SeqChunk]
    input_ids: torch.Tensor  # [T] int64
    layout: SeqLayout
    logits_rows: torch.Tensor  # [R] rows whose logits the step returns
    cis: dict[str, torch.Tensor]  # kind -> the rotations cos + i sin, complex64 [T, rope/2]
    decode_seqs: list[int]  # requests with a single row this step
    prefill_seqs: list[int]
    block_size: int
    max_position: int  # the largest position in the step
    rope_tables: RopeTables
    # Per request, the first position whose compressor rows this step handles (None: every
    # request's chunk start, the usual case; see SeqChunk.compress_from).
    compress_from: list[int] | None = None
    # Speculative verification (core.speculative): when a list, every compressor appends
    # (tail_kv, tail_gate, kv rows, gate rows) of this step, so the tail rows of accepted
    # positions that a rejected one overwrote can be put back.
    capture: list | None = None
    # V4.1: which rows are image tokens (None: none in this step; model.v41.model sets it).
    image_mask: torch.Tensor | None = None
    _plans: dict[tuple, object] = field(default_factory=dict)

    @classmethod
    def build(
        cls, chunks: list[SeqChunk], rope: RopeTables, block_size: int, device: torch.device
    ) -> ForwardBatch:
        if not chunks:
            raise ValueError("a forward batch needs at least one request")
        ids: list[int] = []
        offsets, lens, starts, positions, token_seq, rows = [], [], [], [], [], []
        floors, cfrom = [], []
        width = 1
        for s, c in enumerate(chunks):
            n = len(c.token_ids)
            if n == 0:
                raise ValueError("every request in a step needs at least one token")
            if c.start < 0:
                raise ValueError("chunk start must be >= 0")
            if c.window_floor and (n < 2 or c.window_floor > c.start):
                raise ValueError("a chunk with a window floor needs >= 2 tokens from the floor on")
            floors.append(c.window_floor)
            cfrom.append(max(c.start, c.compress_from))
            need = -(-(c.start + n) // block_size)
            if len(c.block_ids) < need:
                raise ValueError(
                    f"request {s} has {len(c.block_ids)} blocks, needs {need} for "
                    f"{c.start + n} tokens"
                )
            width = max(width, len(c.block_ids))
            offsets.append(len(ids))
            lens.append(n)
            starts.append(c.start)
            if c.logits == "all":
                rows.extend(range(len(ids), len(ids) + n))
            elif c.logits == "last":
                rows.append(len(ids) + n - 1)
            elif c.logits != "none":
                raise ValueError(f"SeqChunk.logits must be last, all or none, got {c.logits!r}")
            ids.extend(c.token_ids)
            positions.extend(range(c.start, c.start + n))
            token_seq.extend([s] * n)
        # One tensor from padded lists: a tensor per request costs more than the table.
        tables = torch.tensor(
            [list(c.block_ids) + [0] * (width - len(c.block_ids)) for c in chunks],
            dtype=torch.long,
        )

        def lt(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.long, device=device)

        pos_t = lt(positions)
        max_pos = max(c.start + len(c.token_ids) for c in chunks) - 1
        cis = {k: rope.cis(pos_t, k, max_pos) for k in ("main", "compress")}
        layout = SeqLayout(
            offsets=offsets,
            lens=lens,
            starts=starts,
            slots=lt([c.slot for c in chunks]),
            block_tables=tables.to(device),
            token_seq=lt(token_seq),
            positions=pos_t,
            starts_t=lt(starts),
            offsets_t=lt(offsets),
            window_floors=floors if any(floors) else None,
            window_floors_t=lt(floors) if any(floors) else None,
        )
        return cls(
            chunks=chunks,
            input_ids=lt(ids),
            layout=layout,
            logits_rows=lt(rows),
            cis=cis,
            decode_seqs=[s for s, n in enumerate(lens) if n == 1],
            prefill_seqs=[s for s, n in enumerate(lens) if n > 1],
            block_size=block_size,
            max_position=max_pos,
            rope_tables=rope,
            compress_from=cfrom if cfrom != starts else None,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return not self.prefill_seqs

    def cached(self, key: tuple, build: Callable[[], T]) -> T:
        """build(), once per step for each key: for what every layer of a shape shares."""
        if key not in self._plans:
            self._plans[key] = build()
        return self._plans[key]  # type: ignore[return-value]

    def cos_sin(self, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, rope/2] of this step's `kind` angles: views of the rotations on CPU
        (whose torch path reads the rotations themselves), contiguous copies once per step
        for the kernels elsewhere."""
        c = self.cis[kind]
        if c.device.type == "cpu":
            return c.real, c.imag
        return self.cached(("cos_sin", kind), lambda: (c.real.contiguous(), c.imag.contiguous()))

    def rope_cis(self, kind: str, inverse: bool, dim: int) -> torch.Tensor:
        """rope_cis of this step's `kind` angles (a view of the step's rotations, conjugated
        once per step for the inverse)."""
        c = self.cis[kind]
        if inverse:
            c = self.cached(("cis_inv", kind), lambda: c.conj().resolve_conj())
        return broadcast_cis(c, dim)

    def tail_rows(self, length: int) -> tuple[torch.Tensor | slice, torch.Tensor]:
        """Rows among each request's last `length` positions (a slice when that is every row),
        and their index in a ring of `length` slots per state slot (the only rows a ring of that
        size keeps)."""
        key = ("tail", length)
        if key not in self._plans and self.is_decode:  # one row per request: all are kept
            lay = self.layout
            self._plans[key] = (slice(None), lay.slots * length + lay.positions % length)
        if key not in self._plans:
            lay = self.layout
            ends = (lay.starts_t + torch.tensor(lay.lens, device=lay.starts_t.device))[
                lay.token_seq
            ]
            keep = (lay.positions >= ends - length).nonzero().flatten()
            dest = lay.slots[lay.token_seq[keep]] * length + lay.positions[keep] % length
            self._plans[key] = (keep, dest)
        return self._plans[key]  # type: ignore[return-value]

    def compress_plan(self, ratio: int, overlap: bool) -> CompressPlan:
        """Entries completed this step for a compressor of `ratio`, overlapping (CSA: each entry
        pools 2 * ratio rows, the previous window's included) or not (HCA: ratio rows)."""
        key = ("comp", ratio, overlap)
        if key in self._plans:
            return self._plans[key]  # type: ignore[return-value]
        keep, keep_dest = self.tail_rows(2 * ratio if overlap else ratio)
        if self.compress_from is not None:  # rows of a cached prefix stay out of the tail
            keep, keep_dest = self._after_compress_from(keep, keep_dest)
        if self.is_decode:
            plan = self._decode_compress_plan(ratio, overlap, keep_dest)
        else:
            plan = self._general_compress_plan(ratio, overlap, keep, keep_dest)
        self._plans[key] = plan
        return plan

    def _compress_starts(self) -> torch.Tensor:
        """[S] each request's first position whose rows the compressors handle this step."""
        lay = self.layout
        if self.compress_from is None:
            return lay.starts_t
        return self.cached(
            ("cfrom",),
            lambda: torch.tensor(self.compress_from, dtype=torch.long, device=lay.starts_t.device),
        )

    def _after_compress_from(
        self, keep: torch.Tensor | slice, dest: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lay = self.layout
        rows = torch.arange(self.num_tokens, device=lay.positions.device)[keep]
        ok = lay.positions[rows] >= self._compress_starts()[lay.token_seq[rows]]
        return rows[ok], dest[ok]

    def _general_compress_plan(
        self, ratio: int, overlap: bool, keep: torch.Tensor | slice, keep_dest: torch.Tensor
    ) -> CompressPlan:
        lay = self.layout
        dev = lay.positions.device
        n_rows = state_len = 2 * ratio if overlap else ratio
        lens_t = torch.tensor(lay.lens, device=dev)
        cstart = self._compress_starts()
        first = cstart // ratio
        # A replayed chunk that ends before its compress_from completes no entry.
        count = ((lay.starts_t + lens_t) // ratio - first).clamp(min=0)
        e_total = int(count.sum())
        entry_seq = torch.repeat_interleave(torch.arange(len(lay.lens), device=dev), count)
        before = torch.cumsum(count, 0) - count
        w = first[entry_seq] + torch.arange(e_total, device=dev) - before[entry_seq]
        base = w * ratio - (ratio if overlap else 0)
        pos = base[:, None] + torch.arange(n_rows, device=dev)[None]
        start = lay.starts_t[entry_seq][:, None]
        from_chunk = pos >= cstart[entry_seq][:, None]
        chunk_row = (lay.offsets_t[entry_seq][:, None] + pos - start).clamp(min=0)
        chunk_row = chunk_row.clamp(max=max(self.num_tokens - 1, 0))
        state_row = lay.slots[entry_seq][:, None] * state_len + torch.remainder(pos, state_len)
        epb = self.block_size // ratio
        blk = lay.block_tables[entry_seq, (w * ratio) // self.block_size]
        tail_row = state_row
        if overlap:  # rows of the previous window pool their first half, the others the second
            tail_row = state_row * 2 + (torch.arange(n_rows, device=dev) >= ratio)
        valid = pos >= 0
        return CompressPlan(
            entry_seq=entry_seq,
            from_chunk=from_chunk,
            chunk_row=chunk_row,
            state_row=state_row,
            valid=valid,
            dest=blk * epb + w % epb,
            rope_pos=w * ratio,
            keep_rows=keep,
            keep_dest=keep_dest,
            chunk_only=bool((from_chunk | (pos < 0)).all()),
            tail_row=tail_row,
            all_valid=bool(valid.all()),
        )

    def _decode_compress_plan(
        self, ratio: int, overlap: bool, keep_dest: torch.Tensor
    ) -> CompressPlan:
        """compress_plan when every request has one row (row s is request s), built from the
        chunks' ints: a few tensors from lists instead of the general path's dozens of tiny
        ops (same values). Entry w of a request at position p exists when p + 1 = (w + 1) *
        ratio; its rows are positions p + 1 - R .. p."""
        n_rows = 2 * ratio if overlap else ratio
        epb = self.block_size // ratio
        dev = self.layout.positions.device
        if all((c.start + 1) % ratio for c in self.chunks):  # most steps: no entry completes
            none = torch.empty(0, dtype=torch.long, device=dev)
            rows = none.view(0, n_rows)
            return CompressPlan(
                entry_seq=none, from_chunk=rows.bool(), chunk_row=rows, state_row=rows,
                valid=rows.bool(), dest=none, rope_pos=none, keep_rows=slice(None),
                keep_dest=keep_dest, chunk_only=True, tail_row=rows, all_valid=True,
            )  # fmt: skip
        seqs, state, tail, dest, rope_pos, firsts = [], [], [], [], [], []
        for s, c in enumerate(self.chunks):
            p = c.start
            if (p + 1) % ratio:
                continue
            w = (p + 1) // ratio - 1
            first = p + 1 - n_rows
            rows = [c.slot * n_rows + (first + r) % n_rows for r in range(n_rows)]
            seqs.append(s)
            firsts.append(first)
            state.extend(rows)
            # The rows of the previous window pool the first half of their tail row, the
            # others the second (CSA); HCA rows are whole tail rows.
            tail.extend([2 * x + (r >= ratio) for r, x in enumerate(rows)] if overlap else rows)
            dest.append(c.block_ids[(w * ratio) // self.block_size] * epb + w % epb)
            rope_pos.append(w * ratio)
        e = len(seqs)

        def lt(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.long, device=dev)

        r = torch.arange(n_rows, device=dev)
        pos = lt(firsts)[:, None] + r  # [E, R]
        seq_t = lt(seqs)
        last = n_rows - 1
        return CompressPlan(
            entry_seq=seq_t,
            from_chunk=(r == last).expand(e, n_rows),
            chunk_row=(seq_t[:, None] + r - last).clamp(min=0),
            state_row=lt(state).view(e, n_rows),
            valid=pos >= 0,
            dest=lt(dest),
            rope_pos=lt(rope_pos),
            keep_rows=slice(None),
            keep_dest=keep_dest,
            chunk_only=all(f + last - 1 < 0 for f in firsts),
            tail_row=lt(tail).view(e, n_rows),
            all_valid=all(f >= 0 for f in firsts),
        )

    def edge_plan(self, ratio: int) -> EdgePlan | None:
        """Rows of this step among the last `ratio` positions of their block (at or after the
        request's compress_from), and where they go in a [blocks, ratio] edge tensor; None when
        there is none (most decode steps)."""
        key = ("edge", ratio)
        if key in self._plans:
            return self._plans[key]  # type: ignore[return-value]
        bs = self.block_size
        rows, dest = [], []
        cfrom = self.compress_from
        for s, c in enumerate(self.chunks):
            lo = c.start if cfrom is None else cfrom[s]
            end = c.start + len(c.token_ids)
            # Blocks whose edge [b * bs + bs - ratio, (b + 1) * bs) meets [lo, end).
            for b in range(lo // bs, -(-end // bs)):
                e0 = b * bs + bs - ratio
                for p in range(max(e0, lo), min(e0 + ratio, end)):
                    rows.append(self.layout.offsets[s] + p - c.start)
                    dest.append(c.block_ids[b] * ratio + p - e0)
        plan = None
        if rows:
            dev = self.layout.positions.device
            plan = EdgePlan(
                torch.tensor(rows, dtype=torch.long, device=dev),
                torch.tensor(dest, dtype=torch.long, device=dev),
            )
        self._plans[key] = plan
        return plan

    def plan_rope(self, ratio: int, overlap: bool) -> torch.Tensor:
        """The compress rotations of the entries compress_plan(ratio, overlap) completes,
        complex64 [E, rope/2]."""
        key = ("comp_rope", ratio, overlap)
        if key not in self._plans:
            pos = self.compress_plan(ratio, overlap).rope_pos
            self._plans[key] = self.rope_tables.cis(pos, "compress", self.max_position)
        return self._plans[key]  # type: ignore[return-value]
