"""The greedy head's masked settle (kernels.greedy_head.MaskedGreedy): from a step's
approximate bf16 logits and their bounds, the exact fp32 argmax of some rows among the tokens a
packed bitmask allows (a grammar's token mask: bit j & 31 of word j >> 5).

The argument is settle's (kernels.greedy) with the row's maximum taken over the allowed tokens
only: the masked fp32 argmax j* is allowed, so approx_j* + e_j* >= exact_j* >= exact_b >=
best - e_best, where b is the allowed token of largest approximate logit `best`; hence
approx_j* >= thr(best), and every allowed token at or above thr gets its fp32 logit.

The numba kernel never builds a masked copy of the row. A row with few allowed tokens (a JSON
structure position) reads only those: the mask's nonzero words, then their set bits. A row with
many (inside a string) walks the row's 128-token tiles in decreasing order of their maximum
(non-negative bf16 values order like their int16 bits; a tile of negatives stands for 0, an
upper bound): the first allowed tokens raise `best`, and the walk stops at the first tile whose
maximum is below thr(best), as every later one is. A row with more than MAX_CANDIDATES tokens
at or above its threshold (a loose bound), or whose threshold is not finite, is answered -1:
the caller computes its logits instead.

`walk_settle` needs no mask, only a membership test (a grammar matcher's validation of one
token, microseconds where a whole mask may take milliseconds): the row's k largest approximate
logits in decreasing order, the first accepted one setting the threshold; it answers only when
every token beyond those k lies below it.
"""

from __future__ import annotations

import numpy as np
import torch

from deepring.kernels.dispatch import cpu_kernel, use_numba, weight_array
from deepring.kernels.greedy import TILE, U_OUT, _bf16_value, settle, threshold_value

# Stands for a refused token's logit in the torch path (finite: an -inf would break the max
# pass's ordering of bf16 bits).
_LOWEST_BF16 = float(torch.finfo(torch.bfloat16).min)
# A row allowing at most this many tokens reads them from its mask's set bits; more, the walk.
_SPARSE = 2048
# Tiles a walk picks by repeated argmax before it sorts the rest (an argmax over a 129k
# vocabulary's ~1,000 tiles is ~1 us, their sort ~30 us: ad-hoc timings, 2-core machine).
_PICKED = 8
# A row with more candidates than this (a loose bound) is left to the caller's fp32 logits.
MAX_CANDIDATES = 2048


def unpack(words: np.ndarray, vocab: int) -> torch.Tensor:
    """Packed masks [n, W] (int32 words, little-endian bit order) as bool [n, vocab]."""
    bits = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), axis=1, bitorder="little")
    out = np.zeros((words.shape[0], vocab), dtype=np.bool_)
    m = min(vocab, bits.shape[1])
    out[:, :m] = bits[:, :m]
    return torch.from_numpy(out)


@cpu_kernel
def _dot(w, y, j, r):
    exact = np.float32(0.0)
    for i in range(y.shape[1]):
        exact += w[j, i] * y[r, i]
    return exact


@cpu_kernel
def _popcount(x):
    v = np.uint32(x)
    v = v - ((v >> 1) & np.uint32(0x55555555))
    v = (v & np.uint32(0x33333333)) + ((v >> 2) & np.uint32(0x33333333))
    v = (v + (v >> 4)) & np.uint32(0x0F0F0F0F)
    return ((v * np.uint32(0x01010101)) & np.uint32(0xFFFFFFFF)) >> 24  # (numba widens)


@cpu_kernel
def _row_tile_tops(row, top_bits):
    """top_bits[t] = the fp32 bits of the largest value of tile t of one row's bf16 keys, at
    least 0 (a tile of negatives stands for 0, an upper bound): read as float32, the tiles'
    maxima. A whole tile's fixed-length int32 loop vectorises: ~25 us a 129k row, where a
    variable-length int16 one took ~200 us (ad-hoc timings, 2-core dev machine)."""
    vocab = row.shape[0]
    for t in range(top_bits.shape[0]):
        key = np.int32(0)
        base = t * TILE
        if base + TILE <= vocab:
            for j in range(TILE):
                v = np.int32(row[base + j])
                key = v if v > key else key
        else:
            for j in range(base, vocab):
                v = np.int32(row[j])
                key = v if v > key else key
        top_bits[t] = np.uint32(key) << 16


@cpu_kernel
def _argmax(x):
    """The index of x's first maximum (no NaN here; np.argmax's checks cost ~2 us a call,
    ad-hoc timing)."""
    best = 0
    for i in range(1, x.shape[0]):
        if x[i] > x[best]:
            best = i
    return best


# The index of a 32-bit word's lowest set bit, from its isolated bit times a de Bruijn sequence.
_DE_BRUIJN = 0x077CB531
_BIT_OF = np.zeros(32, dtype=np.int64)
for _b in range(32):
    _BIT_OF[((1 << _b) * _DE_BRUIJN & 0xFFFFFFFF) >> 27] = _b


@cpu_kernel
def _masked_settle_kernel(bits, rows, words, limit, a, y, w, max_cand, u_out, idx):
    """idx[q] = the fp32 argmax of row rows[q] among the tokens words[q] allows (and < limit),
    or -1 where the caller must compute that row's logits."""
    vocab = bits.shape[1]
    limit = min(limit, vocab)
    groups = (vocab + TILE - 1) // TILE
    n_words = words.shape[1]
    word = np.empty(1, np.uint32)
    as_f32 = word.view(np.float32)
    top_bits = np.empty(groups, np.uint32)  # the tiles' maxima as fp32 values (bf16 widened)
    top = top_bits.view(np.float32)
    ids = np.empty(vocab, np.int64)  # the allowed tokens read, and their approximate logits
    vals = np.empty(vocab, np.float32)
    for q in range(rows.shape[0]):
        r = rows[q]
        idx[q] = -1
        count = 0
        for k in range(n_words):
            count += _popcount(words[q, k])
        n = 0
        best = -np.inf
        if count <= _SPARSE:  # every allowed token, from the set bits of the nonzero words
            for k in range(n_words):
                x = np.int64(words[q, k]) & 0xFFFFFFFF
                while x != 0:
                    low = x & -x
                    x ^= low
                    j = k * 32 + _BIT_OF[((low * _DE_BRUIJN) & 0xFFFFFFFF) >> 27]
                    if j < limit:
                        ids[n] = j
                        vals[n] = _bf16_value(bits[r, j], word, as_f32)
                        best = max(best, vals[n])
                        n += 1
        else:  # the tiles in decreasing order of their maximum, while one may hold a candidate
            _row_tile_tops(bits[r], top_bits)
            thr = -np.inf
            order = np.empty(0, np.int64)
            for p in range(groups):
                # The first few tiles by repeated argmax (usually all a walk takes), then sorted.
                if p < _PICKED:
                    t = _argmax(top)
                elif p == _PICKED:
                    order = np.argsort(-top)
                    t = order[0]
                else:
                    t = order[p - _PICKED]
                if top[t] < thr:
                    break
                top[t] = -np.inf  # (visited)
                for j in range(t * TILE, min(t * TILE + TILE, limit)):
                    if (words[q, j >> 5] >> (j & 31)) & 1:
                        v = _bf16_value(bits[r, j], word, as_f32)
                        if v >= thr:
                            ids[n] = j
                            vals[n] = v
                            n += 1
                            if v > best:
                                best = v
                                thr = threshold_value(best, a[r], u_out)
        thr = threshold_value(best, a[r], u_out)
        if n == 0 or not np.isfinite(thr):
            continue  # no allowed token, or overflowing bounds: the caller's logits
        n_cand = 0
        for c in range(n):
            n_cand += vals[c] >= thr
        if n_cand > max_cand:
            continue  # a loose bound: the caller's logits cost less than these dot products
        exact_top = -np.inf
        win = -1
        for c in range(n):
            if vals[c] >= thr:
                j = ids[c]
                e = _dot(w, y, j, r)
                if e > exact_top or (e == exact_top and j < win):
                    exact_top = e
                    win = j
        idx[q] = win


@cpu_kernel
def _ranked_kernel(row, ids, vals):
    """The k = len(ids) tokens of largest approximate logit of one row (int16 keys), in
    decreasing order, into ids / vals; returns an upper bound on every other token's value
    (-inf when none is left). Tiles are opened in decreasing order of their maximum until the
    next one cannot beat the k-th value held."""
    vocab = row.shape[0]
    k = ids.shape[0]
    groups = (vocab + TILE - 1) // TILE
    top_bits = np.empty(groups, np.uint32)
    _row_tile_tops(row, top_bits)
    top = top_bits.view(np.float32)
    word = np.empty(1, np.uint32)
    as_f32 = word.view(np.float32)
    n = 0
    rest = -np.inf  # the largest value seen and not held
    for _ in range(groups):
        t = _argmax(top)
        if n == k and top[t] <= vals[k - 1]:
            return max(rest, top[t])
        top[t] = -np.inf  # (opened)
        for j in range(t * TILE, min(t * TILE + TILE, vocab)):
            v = _bf16_value(row[j], word, as_f32)
            if n == k and v <= vals[k - 1]:
                rest = max(rest, v)
                continue
            if n == k:
                rest = max(rest, vals[k - 1])
            else:
                n += 1
            c = n - 1  # insertion into the held, decreasing
            while c > 0 and vals[c - 1] < v:
                ids[c] = ids[c - 1]
                vals[c] = vals[c - 1]
                c -= 1
            ids[c] = j
            vals[c] = v
    return rest


@cpu_kernel
def _best_of(w, y, r, cands, n):
    """The token of largest fp32 logit among cands[:n] (lowest id on ties)."""
    top = -np.inf
    win = -1
    for c in range(n):
        j = cands[c]
        e = _dot(w, y, j, r)
        if e > top or (e == top and j < win):
            top = e
            win = j
    return win


def walk_settle(approx, a, y, w, row: int, allows, k: int) -> int | None:
    """Row `row`'s fp32 argmax among the tokens `allows(token) -> bool` accepts, checking only
    its k tokens of largest approximate logit in decreasing order (a grammar's matcher
    validates a token in microseconds, where its whole mask may take milliseconds); None when
    the answer may lie beyond them. The first accepted token sets the threshold (its bound),
    and every accepted token at or above it gets its fp32 logit."""
    ids = np.empty(min(k, approx.shape[1]), dtype=np.int64)
    vals = np.empty(len(ids), dtype=np.float32)
    rest = _ranked_kernel(approx[row].view(torch.int16).numpy(), ids, vals)
    thr = None
    cands = []
    for j, v in zip(ids.tolist(), vals.tolist(), strict=True):
        if thr is not None and v < thr:
            break
        if allows(j):
            if thr is None:
                thr = float(threshold_value(v, float(a[row]), U_OUT))
                if not np.isfinite(thr):
                    return None
            cands.append(j)
    if thr is None or rest >= thr:
        return None
    return int(
        _best_of(
            weight_array(w), y.contiguous().numpy(), row, np.asarray(cands, np.int64), len(cands)
        )
    )


def masked_settle(
    approx: torch.Tensor, a: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
    rows: list[int], words: np.ndarray, limit: int,
) -> list[int | None]:  # fmt: skip
    """For rows `rows` of a settle call (approx [R, V] bf16, bounds a [R], inputs y [R, K]):
    each one's fp32 argmax among the tokens its packed mask (words [len(rows), W]) allows below
    `limit`, first maximum; None where this cannot tell (the caller computes that row's
    logits)."""
    if use_numba(y) and w.dtype == torch.float32 and approx.is_contiguous():
        idx = np.empty(len(rows), dtype=np.int64)
        words = np.ascontiguousarray(words, dtype=np.int32)
        _masked_settle_kernel(
            approx.view(torch.int16).numpy(), np.asarray(rows, dtype=np.int64),
            words, limit, a.float().contiguous().numpy(),
            y.contiguous().numpy(), weight_array(w), MAX_CANDIDATES, U_OUT, idx,
        )  # fmt: skip
        return [int(t) if t >= 0 else None for t in idx]
    return _masked_settle_torch(approx, a, y, w, rows, words, limit)


def _masked_settle_torch(approx, a, y, w, rows, words, limit) -> list[int | None]:
    """The refused tokens' approximate logits become the lowest finite bf16 value and the rows
    are settled again. A refused token can become a candidate only when the threshold sinks to
    the sentinel (overflowing bounds) or through settle's plain fp32 fallback, which knows no
    mask; such a winner is answered None."""
    index = torch.tensor(rows, dtype=torch.long)
    sub = approx.index_select(0, index)
    vocab = sub.shape[1]
    allowed = unpack(words, vocab)
    allowed[:, limit:] = False
    sub.masked_fill_(~allowed, _LOWEST_BF16)
    won = settle(sub, a.index_select(0, index), y.index_select(0, index), w).tolist()
    ok = allowed[torch.arange(len(rows)), torch.tensor(won)].tolist()
    return [tok if good else None for tok, good in zip(won, ok, strict=True)]
