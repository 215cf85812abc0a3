"""Greedy decoding's LM head on CPU: the argmax of fp32 logits, found through a bf16 GEMM.

An fp32 LM head is the largest single cost of a small model's CPU decode step. CPUs with AMX
run the same GEMM in bf16 several times faster, but bf16 logits are approximate. A rigorous bound
on their error says which tokens could still be the fp32 argmax: those whose bf16 logit, plus
its bound, reaches the bf16 maximum minus its bound. Only these (usually just the bf16 winner)
get their fp32 logit, and the largest of those (lowest id on ties) wins: the result is the fp32
argmax, not an approximation of it.

The error bound for logit j of a row y (fp32) against weight row w_j (fp32), with y16, w16 their
bf16 roundings: |bf16_logit_j - y.w_j| <= A + u' |bf16_logit_j|, where
  A = ||y16|| * max_j ||w_j - w16_j|| + ||y - y16|| * max_j ||w_j||     (input rounding)
      + K * 2^-23 * ||y16|| * max_j ||w16_j||                          (fp32 accumulation)
  u' = 2^-8 / (1 - 2^-8)                                               (bf16 output rounding)
(Cauchy-Schwarz on each rounding residual; the products of bf16 values are exact in fp32.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

_U_OUT = 2.0**-8 / (1 - 2.0**-8)
# Tokens per tile of the max pass: few enough that a tile reaching the threshold holds few
# tokens to check, enough that the tile maxima are a small array (ad-hoc timing, 32 rows of a
# 129k vocabulary: 64 took 2.4 ms a step against 2.8 ms with 16; 128 and 256 no better).
_TILE = 64


@functools.cache
def cpu_bf16_is_fast() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX). Elsewhere oneDNN
    emulates bf16 through fp32 and the bf16 head would only add work."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def _packed_gemm(w16: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ w16.T. oneDNN reorders a plain weight into its blocked layout on every call,
    which for an LM head costs more than the GEMM (ad-hoc timing on the 2-core dev machine,
    129k x 128 head: 1.6 ms packed vs 5.4 ms plain for one row, 2.3 vs 7.5 ms for 32 rows); so
    the weight is reordered once."""
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w16, 1)
    except (AttributeError, NotImplementedError, RuntimeError):  # no oneDNN packed linear
        return lambda x: F.linear(x, w16)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


class Bf16GreedyHead:
    """Holds the bf16 copy of an fp32 LM head weight and its norms; rebuilt when the weight
    changes (tracked by data pointer and version counter)."""

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None

    def prepare(self, w: torch.Tensor) -> None:
        key = (w.data_ptr(), w._version)
        if self._key == key:
            return
        w = w.detach()
        w16 = w.to(torch.bfloat16)
        w16f = w16.float()
        self.w_max = float(torch.linalg.vector_norm(w, dim=-1).max())
        self.w16_max = float(torch.linalg.vector_norm(w16f, dim=-1).max())
        self.res_max = float(torch.linalg.vector_norm(w - w16f, dim=-1).max())
        self._gemm = _packed_gemm(w16)
        self._key = key

    def argmax(self, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """argmax_j (y @ w.T)[r, j] in fp32 for each row r (first maximum); y: [R, K]."""
        self.prepare(w)
        y = y.float()
        if not bool(torch.isfinite(y).all()):  # no bound holds; the plain path says what fp32 does
            return F.linear(y, w.float()).argmax(-1)
        y16 = y.to(torch.bfloat16)
        approx = self._gemm(y16)  # [R, V] bf16, kept in bf16: one pass less
        n, vocab = approx.shape
        # One pass over the logits: tile t holds tokens t, t + S, ..., t + (G-1) S (a strided
        # tile makes the pass an element-wise max of G contiguous slices, which vectorises);
        # the last vocab % G tokens form one more tile.
        whole = vocab - vocab % _TILE
        stride = whole // _TILE
        # The max pass runs on the bf16 bits read as int16, several times faster than a bf16
        # reduction on CPU. Non-negative bf16 values order like their bits; a negative key
        # means a tile of negative values only, whose maximum is then bounded above by 0.
        keys = approx.view(torch.int16)
        tile_key = keys[:, :whole].view(n, _TILE, stride).amax(1)
        if whole < vocab:
            tile_key = torch.cat([tile_key, keys[:, whole:].amax(-1, keepdim=True)], 1)
        tile_max = tile_key.clamp(min=0).view(torch.bfloat16).float()  # key 0 is +0.0
        best = tile_max.amax(-1)  # exact where a row has a value >= 0
        neg = tile_key.amax(-1) < 0
        if bool(neg.any()):  # every logit negative: the exact maximum from the values
            best[neg] = approx[neg].float().amax(-1)
        y16f = y16.float()
        y16n = torch.linalg.vector_norm(y16f, dim=-1)
        lo_n = torch.linalg.vector_norm(y - y16f, dim=-1)
        a = y16n * self.res_max + lo_n * self.w_max + y.shape[1] * 2.0**-23 * y16n * self.w16_max
        # Token j can be the fp32 argmax only if approx_j + e_j >= best - e_best, with
        # e = a + u'|approx|; x + u'|x| grows with x, so this is approx_j >= thr.
        floor = best - _U_OUT * best.abs() - 2 * a
        thr = torch.where(floor >= 0, floor / (1 + _U_OUT), floor / (1 - _U_OUT))
        # Candidates: the tokens >= thr inside the (few) tiles whose maximum is >= thr.
        rt, tt = (tile_max >= thr[:, None]).nonzero(as_tuple=True)
        k = torch.arange(_TILE)
        cols = torch.where(tt[:, None] < stride, tt[:, None] + k * stride, whole + k)
        cols = cols.clamp_(max=vocab - 1)
        # Flat index_select rather than approx[rows, cols]: see kernels.gather.
        flat = (rt[:, None] * vocab + cols).view(-1)
        thr_of = thr.index_select(0, rt).repeat_interleave(_TILE)
        keep = approx.view(-1).index_select(0, flat).float() >= thr_of
        # (Clamping may list a token twice: harmless below.)
        r, j = rt.repeat_interleave(_TILE)[keep], cols.view(-1)[keep]
        # Usually one candidate per row; ties in bf16 leave a few, settled by their fp32 logits.
        exact = (w.index_select(0, j).float() * y.index_select(0, r)).sum(-1)
        top = torch.full((n,), float("-inf")).scatter_reduce(0, r, exact, "amax")
        win = exact == top[r]
        idx = torch.full((n,), vocab, dtype=torch.long).scatter_reduce(0, r[win], j[win], "amin")
        lost = idx == vocab  # no candidate: non-finite logits (overflow); fp32 decides
        if bool(lost.any()):
            idx[lost] = F.linear(y[lost], w.float()).argmax(-1)
        return idx
