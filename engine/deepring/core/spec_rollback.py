"""Rolling the caches back after a speculative verification step rejected some drafts.

A verify step feeds each speculating request [last token, drafts] at positions c .. c + G
through the backbone like a prefill chunk, so every row writes the caches: its window ring row,
its compressor tail rows, the compressed entries it completes and its block's edge rows. After
acceptance only c .. c + j - 1 (j >= 1 rows) stay; the caches must then hold exactly what they
would had the request fed only those rows. Per kind of state, the cheapest exact way:

- ring, compressed entries, edges: a rejected position writes rows no accepted position of this
  step writes (the ring is longer than a step; entries and edge rows are per position), so the
  rows it overwrote are snapshotted before the step (a few rows per request) and put back;
- compressor tails are short (2 x ratio rows on CSA): a rejected row may overwrite an accepted
  row of the same step, and a chunk keeps only its last tail_len rows. So the touched rows are
  snapshotted and put back, then the accepted positions' rows are rewritten from the step's own
  projections, which the compressors hand over (ForwardBatch.capture).

Nothing here is needed when every draft is accepted (the step then is a plain prefill chunk),
so it only runs for requests with rejections. Only the backbone's layers are handled: drafters
write their own state for accepted positions only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepring.cache.pool import KVCachePool

TAILS = ("tail_kv", "tail_gate", "index_tail_kv", "index_tail_gate")
ENTRIES = ("comp", "index")
EDGES = ("edge_kv", "edge_gate", "index_edge_kv", "index_edge_gate")


@dataclass(frozen=True)
class Span:
    """One speculating request's rows in a step."""

    slot: int
    blocks: list[int]
    start: int  # position c of its first row (its last committed token)
    length: int  # 1 + drafts
    offset: int  # its first row in the step's batch


@dataclass
class _Rows:
    """Snapshotted rows of one cache tensor (viewed as [-1, last dim])."""

    tensor: torch.Tensor
    span: list[int]  # per row: which span
    position: list[int]  # per row: the position that writes it
    flat: torch.Tensor  # [N] row index into the flat view
    saved: torch.Tensor  # [N, dim] the rows before the step


class StepRollback:
    """Snapshot before a verify step (`__init__`), restore after acceptance (`restore`)."""

    def __init__(self, pool: KVCachePool, num_layers: int, spans: list[Span]) -> None:
        self.spans = spans
        self.block_size = pool.cache.block_size
        self.rows: list[_Rows] = []
        self.tails: list[tuple[torch.Tensor, _Rows]] = []
        for lc in pool.layers[:num_layers] if spans else ():  # nothing to snapshot
            self._snap(lc.ring, self._ring_rows)
            for name in TAILS:
                t = getattr(lc, name)
                if t is not None:
                    self.tails.append((t, self._snap(t, self._ring_rows, keep=False)))
            for name in ENTRIES:
                t = getattr(lc, name)
                if t is not None:
                    self._snap(t, lambda sp, n, r=lc.ratio: self._entry_rows(sp, n, r))
            for name in EDGES:
                t = getattr(lc, name)
                if t is not None:
                    self._snap(t, lambda sp, n, r=lc.ratio: self._edge_rows(sp, n, r))

    # ---- which rows each position writes --------------------------------------------------

    def _ring_rows(self, sp: Span, n: int) -> list[tuple[int, int]]:
        """(position, flat row) of a per-slot ring of n rows (window ring, compressor tail)."""
        first = max(sp.start, sp.start + sp.length - n)  # a chunk keeps its last n rows
        return [(q, sp.slot * n + q % n) for q in range(first, sp.start + sp.length)]

    def _entry_rows(self, sp: Span, epb: int, ratio: int) -> list[tuple[int, int]]:
        out = []
        for q in range(sp.start, sp.start + sp.length):
            if (q + 1) % ratio == 0:
                out.append((q, sp.blocks[q // self.block_size] * epb + (q // ratio) % epb))
        return out

    def _edge_rows(self, sp: Span, n: int, ratio: int) -> list[tuple[int, int]]:
        bs = self.block_size
        out = []
        for q in range(sp.start, sp.start + sp.length):
            if q % bs >= bs - ratio:
                out.append((q, sp.blocks[q // bs] * ratio + q % bs - (bs - ratio)))
        return out

    def _snap(self, t: torch.Tensor, rows_of, keep: bool = True) -> _Rows | None:
        span, pos, flat = [], [], []
        for i, sp in enumerate(self.spans):
            for q, r in rows_of(sp, t.shape[1]):
                span.append(i)
                pos.append(q)
                flat.append(r)
        idx = torch.tensor(flat, dtype=torch.long, device=t.device)
        view = t.view(-1, t.shape[-1])
        rows = _Rows(t, span, pos, idx, view[idx].clone() if flat else view[:0])
        if keep:
            self.rows.append(rows)
        return rows

    # ---- after acceptance -----------------------------------------------------------------

    def restore(self, accepted: list[int], capture: list | None) -> None:
        """accepted[i]: rows of span i that stay (1 .. length). capture: the step's
        ForwardBatch.capture (the compressors' projections)."""
        ends = [sp.start + a for sp, a in zip(self.spans, accepted, strict=True)]
        rejected = [a < sp.length for sp, a in zip(self.spans, accepted, strict=True)]
        if not any(rejected):
            return
        for rows in self.rows:  # rows a rejected position wrote: back to before the step
            pairs = enumerate(zip(rows.span, rows.position, strict=True))
            keep = [k for k, (s, q) in pairs if q >= ends[s]]
            _put_back(rows, keep)
        projected = {id(tk): (kv, gate) for tk, _tg, kv, gate in capture or ()}
        projected.update({id(tg): (gate, kv) for _tk, tg, kv, gate in capture or ()})
        for t, rows in self.tails:
            # Every touched row of a request with rejections goes back, then its accepted
            # positions' rows (the last tail_len of them) are written again from the step.
            _put_back(rows, [k for k, s in enumerate(rows.span) if rejected[s]])
            own = projected.get(id(t))
            if own is None:
                raise RuntimeError("a compressor tail was written without its projections")
            n = t.shape[1]
            src, dst = [], []
            for i, sp in enumerate(self.spans):
                if rejected[i]:
                    for q in range(max(sp.start, ends[i] - n), ends[i]):
                        src.append(sp.offset + q - sp.start)
                        dst.append(sp.slot * n + q % n)
            if dst:
                dev = t.device
                view = t.view(-1, t.shape[-1])
                view[torch.tensor(dst, device=dev)] = own[0][torch.tensor(src, device=dev)].to(
                    t.dtype
                )


def _put_back(rows: _Rows, keep: list[int]) -> None:
    if not keep:
        return
    k = torch.tensor(keep, dtype=torch.long, device=rows.flat.device)
    rows.tensor.view(-1, rows.tensor.shape[-1])[rows.flat[k]] = rows.saved[k]
