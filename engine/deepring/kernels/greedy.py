"""The greedy head's settling pass (model.greedy_head): from approximate bf16 logits and their
error bound, the exact fp32 argmax of each row.

Token j can be the fp32 argmax only if approx_j + e_j >= best - e_best, where best is the row's
approximate maximum and e = a + u'|approx| the bound on each approximate logit's error; since
x + u'|x| grows with x, that is approx_j >= thr. The few tokens at or above thr get their fp32
logit, and the largest (lowest id on ties) wins.

One pass over the logits finds the candidates: tile t holds tokens t, t + S, ..., t + (G-1) S (a
strided tile makes the pass an element-wise max of G contiguous slices, which vectorises); the
last vocab % G tokens form one more tile. Only the tiles whose maximum reaches thr are searched.
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

from deepring.kernels.dispatch import cpu_kernel, use_numba

U_OUT = 2.0**-8 / (1 - 2.0**-8)  # bf16 output rounding, relative to the rounded value
# Tokens per tile of the max pass: few enough that a tile reaching the threshold holds few
# tokens to check, enough that the tile maxima are a small array (ad-hoc timing, 32 rows of a
# 129k vocabulary: 64 took 2.4 ms a step against 2.8 ms with 16; 128 and 256 no better).
TILE = 64
MAX_TILES = 256


def _tile_keys(approx: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """The largest int16 key of each tile [R, G'], the tokens in whole tiles, the tile stride."""
    n, vocab = approx.shape
    whole = vocab - vocab % TILE
    stride = whole // TILE
    keys = approx.view(torch.int16)
    tile_key = keys[:, :whole].view(n, TILE, stride).amax(1)
    if whole < vocab:
        tile_key = torch.cat([tile_key, keys[:, whole:].amax(-1, keepdim=True)], 1)
    return tile_key, whole, stride


def _threshold(best: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    floor = best - U_OUT * best.abs() - 2 * a
    return torch.where(floor >= 0, floor / (1 + U_OUT), floor / (1 - U_OUT))


def _plain_rows(y: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, lost: torch.Tensor) -> None:
    if bool(lost.any()):
        idx[lost] = F.linear(y[lost], w.float()).argmax(-1)


def settle_torch(
    approx: torch.Tensor, a: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """approx: [R, V] bf16 logits whose error is at most a + u'|approx| (a: [R]); y: [R, K] fp32
    rows; w: [V, K] the fp32 weight. Returns the fp32 argmax of each row (first maximum)."""
    n, vocab = approx.shape
    tile_key, whole, stride = _tile_keys(approx)
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
    cols = torch.where(tt[:, None] < stride, tt[:, None] + k * stride, whole + k)
    cols = cols.clamp_(max=vocab - 1)
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
def _settle_kernel(bits, tile_key, a, y, w, stride, whole, max_tiles, u_out, idx):
    """idx[r] = the fp32 argmax of row r, or -1 where the row needs its plain fp32 logits."""
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
            word[0] = np.uint32(top_key) << 16
            best = as_f32[0]
        else:  # every logit negative: the exact maximum from the values
            best = -np.inf
            for j in range(vocab):
                word[0] = np.uint32(np.uint16(bits[r, j])) << 16
                best = max(best, as_f32[0])
        floor = best - u_out * abs(best) - 2 * a[r]
        thr = floor / (1 + u_out) if floor >= 0 else floor / (1 - u_out)
        idx[r] = -1
        if not np.isfinite(thr):
            continue
        reach = 0
        for t in range(groups):
            word[0] = np.uint32(max(tile_key[r, t], 0)) << 16
            if as_f32[0] >= thr:
                reach += 1
        if reach > max_tiles:
            continue
        top = -np.inf
        win = vocab
        for t in range(groups):
            word[0] = np.uint32(max(tile_key[r, t], 0)) << 16
            if as_f32[0] < thr:
                continue
            for k in range(TILE):
                j = t + k * stride if t < stride else whole + k
                if j >= vocab:
                    break
                word[0] = np.uint32(np.uint16(bits[r, j])) << 16
                if as_f32[0] < thr:
                    continue
                exact = np.float32(0.0)
                for i in range(k_dim):
                    exact += w[j, i] * y[r, i]
                if exact > top or (exact == top and j < win):
                    top = exact
                    win = j
        if win < vocab:
            idx[r] = win


def settle_numba(
    approx: torch.Tensor, a: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """settle_torch with everything after the max pass in one kernel call."""
    tile_key, whole, stride = _tile_keys(approx)
    idx = torch.empty(approx.shape[0], dtype=torch.long)
    _settle_kernel(
        approx.view(torch.int16).numpy(), tile_key.contiguous().numpy(),
        a.float().contiguous().numpy(), y.contiguous().numpy(), w.detach().contiguous().numpy(),
        stride, whole, MAX_TILES, U_OUT, idx.numpy(),
    )  # fmt: skip
    _plain_rows(y, w, idx, idx < 0)
    return idx


def settle(approx: torch.Tensor, a: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    fast = use_numba(y) and w.dtype == torch.float32 and approx.is_contiguous()
    return (settle_numba if fast else settle_torch)(approx, a, y, w)
