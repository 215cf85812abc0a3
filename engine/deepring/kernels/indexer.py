"""Lightning-indexer scores and top-k selection over a request's compressed index keys.

score[t, e] = sum_h w[t, h] * relu(q[t, h] . k[e]) * scale, for causal entries
e < (pos_t + 1) // ratio (others -inf). The top `topk` entries per row are returned (-1 where a
row has fewer causal entries). Ties are broken towards the lower entry index, independent of
batch composition: selection is a stable descending sort, not torch.topk.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from deepring.kernels.attention_prefill import SeqLayout
from deepring.kernels.dispatch import (
    HAVE_TRITON,
    cpu_kernel,
    cpu_parallel_kernel,
    next_pow2,
    prange,
    run_rows,
    use_numba,
    use_triton,
)
from deepring.kernels.gather import paged_rows, take_entries

# Rows per thread below which the top-k kernel does not split its rows (dispatch.run_rows).
_ROWS_PER_THREAD = 4


def _n_entries(layout: SeqLayout, ratio: int) -> int:
    return max(
        ((p + n) // ratio for p, n in zip(layout.starts, layout.lens, strict=True)), default=0
    )


def _row_products(
    qf: torch.Tensor, index_cache: torch.Tensor, tables: torch.Tensor, e: torch.Tensor
) -> torch.Tensor:
    """q . k for single-row requests: qf [B, HI, DI] fp32 against entries e of each request's
    index keys (block tables [B, ...]): [B, HI, N] in one GEMM."""
    keys = take_entries(index_cache, paged_rows(tables, e, index_cache.shape[1])).float()
    return torch.bmm(qf, keys.transpose(1, 2))


def _products(
    qf: torch.Tensor, index_cache: torch.Tensor, layout: SeqLayout, ratio: int, e: torch.Tensor
) -> Iterator[tuple[slice | torch.Tensor, torch.Tensor, bool]]:
    """The query-key products q . k of the rows (qf [T, HI, DI] fp32) against their requests'
    index keys, by torch GEMMs: yields (rows, s, single), s [rows, HI, N] over entries 0..N-1.
    First the single-row requests (decode rows) together, one batched GEMM (rows = slice(None)
    when they are every row, else their row ids; single = True); then each longer chunk that
    has an entry, one GEMM (rows a slice; single = False)."""
    t = qf.shape[0]
    single = [i for i, n in enumerate(layout.lens) if n == 1]
    if len(single) == t:  # a decode step: row i is request i
        yield slice(None), _row_products(qf, index_cache, layout.block_tables, e), True
        return
    if single:
        rows = torch.tensor([layout.offsets[i] for i in single], device=qf.device)
        tables = layout.block_tables.index_select(0, torch.tensor(single, device=qf.device))
        yield rows, _row_products(qf[rows], index_cache, tables, e), True
    for s_i, (a, n_rows, p0) in enumerate(
        zip(layout.offsets, layout.lens, layout.starts, strict=True)
    ):
        n = (p0 + n_rows) // ratio
        if n == 0 or n_rows == 1:
            continue
        rows = paged_rows(layout.block_tables[s_i : s_i + 1], e[:n], index_cache.shape[1])
        keys = take_entries(index_cache, rows)[0].float()
        yield slice(a, a + n_rows), torch.matmul(qf[a : a + n_rows], keys.t()), False


def indexer_scores_torch(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    layout: SeqLayout,
    ratio: int,
    scale: float,
) -> torch.Tensor:
    """q: [T, HI, DI] (roped); weights: [T, HI]. Returns fp32 scores [T, N] (N = max entries)."""
    t = q.shape[0]
    n_max = _n_entries(layout, ratio)
    dev = q.device
    scores = torch.full((t, n_max), float("-inf"), device=dev)
    if n_max == 0 or t == 0:
        return scores
    e = torch.arange(n_max, device=dev)
    # The head sum is a batched GEMV with the scale folded into the weights: one pass over the
    # [rows, heads, entries] products instead of a scaled copy, a weighted copy and a sum.
    wf = (weights.float() * scale)[:, None, :]
    for rows, s, _ in _products(q.float(), index_cache, layout, ratio, e):
        scores[rows, : s.shape[2]] = torch.bmm(wf[rows], s.relu_()).squeeze(1)
    causal = (layout.positions + 1) // ratio
    return scores.masked_fill(e[None] >= causal[:, None], float("-inf"))


def select_topk(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-k entry ids per row, -1 for non-causal picks; deterministic tie order."""
    k = min(topk, scores.shape[1])
    vals, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
    vals, idx = vals[:, :k], idx[:, :k]
    return torch.where(vals == float("-inf"), torch.full_like(idx, -1), idx)


@cpu_kernel
def _select_kernel(s, w, positions, ratio, ordered, idx):
    """score[e] = sum_h w[b, h] * relu(s[b, h, e]) over row b's causal entries, then the top k
    (k = idx.shape[1]; ties to the lower entry, -1 past the causal ones): in select_topk's
    order (descending) when `ordered`, else in entry order."""
    b_rows, heads, n_max = s.shape
    k = idx.shape[1]
    score = np.empty(n_max, np.float32)
    buf = np.empty(n_max, np.float32)
    sel = np.empty(max(k, 1), np.int64)
    for b in range(b_rows):
        n = min((positions[b] + 1) // ratio, n_max)
        kk = min(k, n)
        m = 0
        if n <= k and not ordered:  # every causal entry
            for e in range(n):
                sel[e] = e
            m = n
            kk = 0
        if kk > 0:
            for e in range(n):
                score[e] = 0.0
            for h in range(heads):
                wh = w[b, h]
                for e in range(n):
                    score[e] += wh * max(s[b, h, e], np.float32(0.0))
            # Quickselect: afterwards buf[kk - 1] holds the kk-th largest score.
            for e in range(n):
                buf[e] = score[e]
            lo, hi = 0, n - 1
            while lo < hi:
                pivot = buf[(lo + hi) // 2]
                i, j = lo, hi
                while i <= j:
                    while buf[i] > pivot:
                        i += 1
                    while buf[j] < pivot:
                        j -= 1
                    if i <= j:
                        buf[i], buf[j] = buf[j], buf[i]
                        i += 1
                        j -= 1
                if kk - 1 <= j:
                    hi = j
                elif kk - 1 >= i:
                    lo = i
                else:
                    break
            v = buf[kk - 1]
            ties = kk
            for e in range(n):
                if score[e] > v:
                    ties -= 1
            for e in range(n):  # in entry order, so the sort below is stable
                if m < kk and (score[e] > v or (score[e] == v and ties > 0)):
                    if score[e] == v:
                        ties -= 1
                    sel[m] = e
                    m += 1
            for a in range(1, m if ordered else 0):  # stable insertion sort, descending
                cur = sel[a]
                c = score[cur]
                j = a - 1
                while j >= 0 and score[sel[j]] < c:
                    sel[j + 1] = sel[j]
                    j -= 1
                sel[j + 1] = cur
        for a in range(k):
            idx[b, a] = sel[a] if a < m else -1


@cpu_parallel_kernel
def _select_rows(s, w, positions, ratio, ordered, idx, parts):
    """_select_kernel on `parts` ranges of rows, in parallel."""
    n = s.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _select_kernel(s[a:b], w[a:b], positions[a:b], ratio, ordered, idx[a:b])


def _select(s: torch.Tensor, w: torch.Tensor, pos: torch.Tensor, ratio: int, ordered: bool,
            idx: torch.Tensor) -> None:  # fmt: skip
    run_rows(_select_kernel, _select_rows, _ROWS_PER_THREAD, s.numpy(), w.numpy(), pos.numpy(),
             ratio, ordered, idx.numpy())  # fmt: skip


def indexer_topk_numba(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    layout: SeqLayout,
    ratio: int,
    topk: int,
    scale: float,
) -> torch.Tensor:
    """indexer_topk on fp32 CPU tensors: the query-key products by torch GEMMs (one for all
    single-row requests, one per longer chunk), then the head sum, causal limit and top-k of
    every row in one kernel, instead of about a dozen ops around a sort. Single-row requests
    get select_topk's order, rows of longer chunks their picks in entry order."""
    t = q.shape[0]
    n_max = _n_entries(layout, ratio)
    # -1 stays in the rows of chunks that have no complete entry yet (_products skips them).
    idx = torch.full((t, min(topk, n_max)), -1, dtype=torch.long)
    if t == 0 or n_max == 0:
        return idx
    w = (weights.float() * scale).contiguous()
    pos = layout.positions.contiguous()
    for rows, s, single in _products(q.float(), index_cache, layout, ratio, torch.arange(n_max)):
        if isinstance(rows, slice):  # a view: the kernel writes idx itself
            _select(s, w[rows], pos[rows], ratio, single, idx[rows])
        else:
            picks = torch.empty(len(rows), idx.shape[1], dtype=torch.long)
            _select(s, w[rows], pos[rows], ratio, single, picks)
            idx[rows] = picks
    return idx


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _indexer_scores_kernel(
        q_ptr, w_ptr, k_ptr, out_ptr, token_seq_ptr, pos_ptr, bt_ptr,
        HI, DI, EPB, RATIO, N, scale,
        stride_qt, stride_qh, stride_wt, stride_kb, stride_ke, stride_ot, stride_bt,
        PREC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        nb = tl.program_id(1)
        heads = tl.arange(0, BLOCK_H)
        hmask = heads < HI
        dcols = tl.arange(0, BLOCK_D)
        dmask = dcols < DI
        s = tl.load(token_seq_ptr + row)
        pos = tl.load(pos_ptr + row)
        n_causal = (pos + 1) // RATIO
        e = (nb * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        valid = e < n_causal
        q = tl.load(
            q_ptr + row * stride_qt + heads[:, None] * stride_qh + dcols[None, :],
            mask=hmask[:, None] & dmask[None, :], other=0.0,
        )  # fmt: skip
        w = tl.load(w_ptr + row * stride_wt + heads, mask=hmask, other=0.0).to(tl.float32)
        ee = tl.where(valid, e, 0)
        blk = tl.load(bt_ptr + s * stride_bt + ee // EPB, mask=valid, other=0)
        kptr = k_ptr + blk * stride_kb + (ee % EPB) * stride_ke
        k = tl.load(kptr[:, None] + dcols[None, :], mask=valid[:, None] & dmask[None, :], other=0.0)
        sc = tl.maximum(tl.dot(q, tl.trans(k), input_precision=PREC), 0.0) * scale
        tot = tl.sum(sc * w[:, None], axis=0)
        tot = tl.where(valid, tot, float("-inf"))
        tl.store(out_ptr + row * stride_ot + e, tot, mask=e < N)


def indexer_scores_triton(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    layout: SeqLayout,
    ratio: int,
    scale: float,
    block_n: int = 32,
) -> torch.Tensor:
    t, hi, di = q.shape
    n_max = _n_entries(layout, ratio)
    out = torch.full((t, n_max), float("-inf"), device=q.device)
    if t == 0 or n_max == 0:
        return out
    if q.stride(-1) != 1 or index_cache.stride(-1) != 1:
        raise ValueError("indexer inputs need a contiguous last dimension")
    weights = weights.float().contiguous()
    _indexer_scores_kernel[(t, triton.cdiv(n_max, block_n))](
        q, weights, index_cache, out, layout.token_seq, layout.positions, layout.block_tables,
        hi, di, index_cache.shape[1], ratio, n_max, float(scale),
        q.stride(0), q.stride(1), weights.stride(0), index_cache.stride(0),
        index_cache.stride(1), out.stride(0), layout.block_tables.stride(0),
        PREC="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_H=max(16, next_pow2(hi)), BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(di)),
    )  # fmt: skip
    return out


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    layout: SeqLayout,
    ratio: int,
    topk: int,
    scale: float,
) -> torch.Tensor:
    """The top `topk` entries of each row: in select_topk's order for single-row chunks (decode
    rows), which gather their keys in that order; for the rows of longer chunks, whose
    attention only masks by the picks, in any order (torch path: see _picks_of_chunks)."""
    if use_triton(q):
        return select_topk(
            indexer_scores_triton(q, weights, index_cache, layout, ratio, scale), topk
        )
    if use_numba(q):
        return indexer_topk_numba(q, weights, index_cache, layout, ratio, topk, scale)
    scores = indexer_scores_torch(q, weights, index_cache, layout, ratio, scale)
    return _picks_of_chunks(scores, topk, layout, ratio)


def _picks_of_chunks(
    scores: torch.Tensor, topk: int, layout: SeqLayout, ratio: int
) -> torch.Tensor:
    """select_topk, except that rows of multi-row chunks with at most k causal entries pick all
    of them, in entry order, without the sort (about half the rows of a prefill; the sort was
    the indexer's largest op there)."""
    k = min(topk, scores.shape[1])
    if all(n == 1 for n in layout.lens):
        return select_topk(scores, topk)
    dev = scores.device
    causal = (layout.positions + 1) // ratio
    multi = torch.tensor([n > 1 for n in layout.lens], device=dev)[layout.token_seq]
    easy = multi & (causal <= k)
    rest = (~easy).nonzero().flatten()
    cols = torch.arange(k, device=dev)
    picks = torch.where(cols < causal[:, None], cols, -1)
    if rest.numel():
        picks[rest] = select_topk(scores.index_select(0, rest), topk)
    return picks
