"""The greedy head's settling pass (kernels.greedy_head): from approximate bf16 logits and their
error bound, the exact fp32 argmax of each row.

Token j can be the fp32 argmax only if approx_j + e_j >= best - e_best, where best is the row's
approximate maximum and e = a + u'|approx| the bound on each approximate logit's error; since
x + u'|x| grows with x, that is approx_j >= thr. The few tokens at or above thr get their fp32
logit, and the largest (lowest id on ties) wins.

One pass over the logits finds the candidates: tile t holds the G tokens t G .. t G + G - 1, the
last vocab % G tokens form one more tile, and only the tiles whose maximum reaches thr are
searched, each a contiguous run of logits.
The max pass runs on the bf16 bits read as int16, several times faster than a bf16 reduction on
CPU. Non-negative bf16 values order like their bits; a negative key means a tile of negative
values only, whose maximum is then bounded above by 0.

Rows that would search more than MAX_TILES tiles (a loose bound), or whose threshold is not
finite (overflowing logits), take their fp32 logits from a plain GEMM instead.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from deepring.kernels.dispatch import (
    cpu_kernel,
    cpu_parallel_kernel,
    prange,
    run_rows,
    use_numba,
    weight_array,
)

U_OUT = 2.0**-8 / (1 - 2.0**-8)  # bf16 output rounding, relative to the rounded value
# Tokens per tile: few enough that a tile reaching the threshold holds few tokens to check, and
# enough that torch's max over each tile vectorises (ad-hoc timing, 32 rows of a 129k vocabulary:
# 174 us with 128, 252 us with 64, 683 us with 32). Contiguous tiles: the candidates of a tile
# are a few cache lines, where tiles strided across the vocabulary cost a cache miss per token.
TILE = 128
MAX_TILES = 256
# Rows per thread below which settling does not split its rows (dispatch.run_rows).
_ROWS_PER_THREAD = 4


def _tile_keys(approx: torch.Tensor) -> torch.Tensor:
    """The largest int16 key of each tile [R, ceil(V / TILE)]."""
    n, vocab = approx.shape
    whole = vocab - vocab % TILE
    keys = approx.view(torch.int16)
    tile_key = keys[:, :whole].view(n, whole // TILE, TILE).amax(-1)
    if whole < vocab:
        tile_key = torch.cat([tile_key, keys[:, whole:].amax(-1, keepdim=True)], 1)
    return tile_key


def _threshold(best: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    floor = best - U_OUT * best.abs() - 2 * a
    return torch.where(floor >= 0, floor / (1 + U_OUT), floor / (1 - U_OUT))


@cpu_kernel
def threshold_value(best, a, u_out):
    """_threshold of one row, in the kernels (and their Python callers)."""
    floor = best - u_out * abs(best) - 2 * a
    return floor / (1 + u_out) if floor >= 0 else floor / (1 - u_out)


def _plain_rows(y: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, lost: torch.Tensor) -> None:
    if bool(lost.any()):
        idx[lost] = F.linear(y[lost], w.float()).argmax(-1)


def settle_torch(
    approx: torch.Tensor, a: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """approx: [R, V] bf16 logits whose error is at most a + u'|approx| (a: [R]); y: [R, K] fp32
    rows; w: [V, K] the fp32 weight. Returns the fp32 argmax of each row (first maximum)."""
    n, vocab = approx.shape
    tile_key = _tile_keys(approx)
    tile_max = tile_key.clamp(min=0).view(torch.bfloat16).float()  # key 0 is +0.0
    best = tile_max.amax(-1)  # exact where a row has a value >= 0
    neg = tile_key.amax(-1) < 0
    if bool(neg.any()):  # every logit negative: the exact maximum from the values
        best[neg] = approx[neg].float().amax(-1)
    thr = _threshold(best, a)
    reach = tile_max >= thr[:, None]
    plain = ~torch.isfinite(thr) | (reach.sum(-1) > MAX_TILES)
    if bool(plain.any()):
        reach[plain] = False
    rt, tt = reach.nonzero(as_tuple=True)
    k = torch.arange(TILE)
    cols = (tt[:, None] * TILE + k).clamp_(max=vocab - 1)
    # Flat index_select rather than approx[rows, cols]: see kernels.gather.
    flat = (rt[:, None] * vocab + cols).view(-1)
    thr_of = thr.index_select(0, rt).repeat_interleave(TILE)
    keep = approx.view(-1).index_select(0, flat).float() >= thr_of
    # (Clamping may list a token twice: harmless below.)
    r, j = rt.repeat_interleave(TILE)[keep], cols.view(-1)[keep]
    # Usually one candidate per row; ties leave a few, settled by their fp32 logits.
    exact = (w.index_select(0, j).float() * y.index_select(0, r)).sum(-1)
    top = torch.full((n,), float("-inf")).scatter_reduce(0, r, exact, "amax")
    win = exact == top[r]
    idx = torch.full((n,), vocab, dtype=torch.long).scatter_reduce(0, r[win], j[win], "amin")
    _plain_rows(y, w, idx, idx == vocab)  # no candidate: sent to fp32 above
    return idx


@cpu_kernel
def _bf16_value(key, word, as_f32):
    """The value of a bf16 bit pattern (int16), through a one-word scratch buffer."""
    word[0] = np.uint32(np.uint16(key)) << 16
    return as_f32[0]


@cpu_kernel
def _ceil_key(thr, word, as_f32):
    """The smallest int16 key of a non-negative bf16 value >= thr (thr > 0, finite)."""
    as_f32[0] = np.float32(thr)
    if np.float64(as_f32[0]) < thr:  # thr was rounded down to fp32
        word[0] += 1
    key = np.int64(word[0] >> 16)
    if word[0] & 0xFFFF:
        key += 1
    return key


@cpu_kernel
def _reaches(key, by_key, key_thr, thr, word, as_f32):
    """Whether the bf16 value with bits `key` is >= thr: on the keys when thr > 0 (by_key, with
    key_thr = _ceil_key(thr)), else on the value."""
    if by_key:
        return key >= key_thr
    return _bf16_value(key, word, as_f32) >= thr


@cpu_kernel
def _settle_kernel(bits, tile_key, a, y, w, max_tiles, u_out, idx):
    """idx[r] = the fp32 argmax of row r, or -1 where the row needs its plain fp32 logits.
    With a positive threshold every comparison runs on the int16 keys (non-negative bf16 values
    order like their bits, negative ones are below it); otherwise on the values."""
    n, vocab = bits.shape
    groups = tile_key.shape[1]
    k_dim = y.shape[1]
    # bf16 -> fp32: the 16 bits become the top half of an fp32 word.
    word = np.empty(1, np.uint32)
    as_f32 = word.view(np.float32)
    for r in range(n):
        top_key = np.int16(-32768)
        for t in range(groups):
            top_key = max(top_key, tile_key[r, t])
        if top_key >= 0:
            best = _bf16_value(top_key, word, as_f32)
        else:  # every logit negative: the exact maximum from the values
            best = -np.inf
            for j in range(vocab):
                best = max(best, _bf16_value(bits[r, j], word, as_f32))
        thr = threshold_value(best, a[r], u_out)
        idx[r] = -1
        if not np.isfinite(thr):
            continue
        by_key = thr > 0
        key_thr = _ceil_key(thr, word, as_f32) if by_key else 0
        # A tile of negative values only has key < 0 and stands for 0 (an upper bound).
        reach = 0
        for t in range(groups):
            reach += _reaches(max(tile_key[r, t], 0), by_key, key_thr, thr, word, as_f32)
        if reach > max_tiles:
            continue
        top = -np.inf
        win = vocab
        for t in range(groups):
            if not _reaches(max(tile_key[r, t], 0), by_key, key_thr, thr, word, as_f32):
                continue
            for j in range(t * TILE, min(t * TILE + TILE, vocab)):
                if not _reaches(bits[r, j], by_key, key_thr, thr, word, as_f32):
                    continue
                exact = np.float32(0.0)
                for i in range(k_dim):
                    exact += w[j, i] * y[r, i]
                if exact > top or (exact == top and j < win):
                    top = exact
                    win = j
        if win < vocab:
            idx[r] = win


@cpu_parallel_kernel
def _settle_rows(bits, tile_key, a, y, w, max_tiles, u_out, idx, parts):
    """_settle_kernel on `parts` ranges of rows, in parallel."""
    n = bits.shape[0]
    for c in prange(parts):
        lo, hi = c * n // parts, (c + 1) * n // parts
        _settle_kernel(bits[lo:hi], tile_key[lo:hi], a[lo:hi], y[lo:hi], w, max_tiles, u_out,
                       idx[lo:hi])  # fmt: skip


def settle_numba(
    approx: torch.Tensor, a: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """settle_torch with everything after the max pass in one kernel call."""
    tile_key = _tile_keys(approx)
    idx = torch.empty(approx.shape[0], dtype=torch.long)
    run_rows(
        _settle_kernel, _settle_rows, _ROWS_PER_THREAD, approx.view(torch.int16).numpy(),
        tile_key.contiguous().numpy(), a.float().contiguous().numpy(), y.contiguous().numpy(),
        weight_array(w), MAX_TILES, U_OUT, idx.numpy(),
    )  # fmt: skip
    _plain_rows(y, w, idx, idx < 0)
    return idx


def quantize_rows_torch(
    y: torch.Tensor, res_term: float, w_max: float
) -> tuple[torch.Tensor, float, torch.Tensor] | None:
    """The int8 head's input (kernels.greedy_head): rows y [R, K] (fp32) as int8 q with one scale
    x, and each row's bound A = ||x q|| * res_term + ||y - x q|| * w_max. None when y holds a
    non-finite value (no bound holds)."""
    if not bool(torch.isfinite(y).all()):
        return None
    top = y.abs().amax()
    x = torch.where(top > 0, top / 127, torch.ones_like(top))  # fp32, exactly as used below
    q = torch.round(y / x).clamp_(-127, 127)
    lp = q * x
    a = torch.linalg.vector_norm(lp, dim=-1) * res_term
    a += torch.linalg.vector_norm(y - lp, dim=-1) * w_max
    return q.to(torch.int8), float(x), a


def row_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def weight_norms(w: torch.Tensor, lp: torch.Tensor) -> tuple[float, float, float]:
    """max_j ||w_j||, max_j ||w'_j|| and max_j ||w_j - w'_j|| for the greedy heads' bounds
    (kernels.greedy_head's docstring); lp: the low-precision stand-in w' in fp32."""
    return float(row_norm(w).max()), float(row_norm(lp).max()), float(row_norm(w - lp).max())


def int8_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float, float]]:
    """The int8 heads' weight: each vocabulary row scaled to -127..127 (s_j = max|w_j| / 127, 1
    for an all-zero row): the values q (fp32, integral), the scales s, and weight_norms of
    w' = s_j q_j."""
    scale = w.abs().amax(-1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row
    q = torch.round(w / scale[:, None]).clamp_(-127, 127)
    return q, scale, weight_norms(w, q * scale[:, None])


@cpu_kernel
def finite_absmax(row):
    """max |row| of a 1-D fp32 row, or -1 when it holds an inf or a NaN."""
    top = np.float32(0.0)
    bad = np.float32(0.0)
    for i in range(row.shape[0]):
        bad += row[i] * np.float32(0.0)  # NaN once any value is inf or NaN
        top = max(top, abs(row[i]))
    return np.float32(-1.0) if bad != 0.0 or not np.isfinite(top) else top


@cpu_kernel
def _quantize_kernel(y, res_term, w_max, q, a):
    """quantize_rows_torch in two passes over y; returns the scale, or -1 for non-finite y."""
    n, k = y.shape
    top = np.float32(0.0)
    for r in range(n):
        t = finite_absmax(y[r])
        if t < 0:
            return np.float32(-1.0)
        top = max(top, t)
    x = top / np.float32(127.0) if top > 0 else np.float32(1.0)
    rt = np.float32(res_term)
    wm = np.float32(w_max)
    for r in range(n):
        lp_ss = np.float32(0.0)
        res_ss = np.float32(0.0)
        for i in range(k):
            qi = min(max(np.round(y[r, i] / x), np.float32(-127.0)), np.float32(127.0))
            q[r, i] = np.int8(qi)
            lp = qi * x
            lp_ss += lp * lp
            res_ss += (y[r, i] - lp) * (y[r, i] - lp)
        a[r] = np.sqrt(lp_ss) * rt + np.sqrt(res_ss) * wm
    return x


def quantize_rows_numba(
    y: torch.Tensor, res_term: float, w_max: float
) -> tuple[torch.Tensor, float, torch.Tensor] | None:
    y = y.contiguous()
    q = torch.empty(y.shape, dtype=torch.int8)
    a = torch.empty(y.shape[0])
    x = float(_quantize_kernel(y.numpy(), res_term, w_max, q.numpy(), a.numpy()))
    return None if x < 0 else (q, x, a)


def quantize_rows(
    y: torch.Tensor, res_term: float, w_max: float
) -> tuple[torch.Tensor, float, torch.Tensor] | None:
    fn = quantize_rows_numba if use_numba(y) else quantize_rows_torch
    return fn(y, res_term, w_max)


def settle(approx: torch.Tensor, a: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    fast = use_numba(y) and w.dtype == torch.float32 and approx.is_contiguous()
    return (settle_numba if fast else settle_torch)(approx, a, y, w)
