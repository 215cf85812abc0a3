"""The int8-avx2 greedy head (kernels.greedy_head): our own AVX2 kernel
(`deepring_recipe._native._Int8Head`, crates/kernels/src/int8_head.rs) finds, in one pass over
the vocabulary, the few tokens of each row that can still be its fp32 argmax; only those get
their fp32 logits. No logits reach memory.

The weight is quantised per vocabulary row as for the other int8 heads (w'_j = s_j q_j, s_j =
max|w_j| / 127), each row of the batch with a scale of its own to 7 bits (y' = x_r q, |q| <=
63: the kernel's `vpmaddubsw` pair sums then never saturate). The kernel's logit
f32(q . q_j) * (x_r * s_j) is y'.w'_j up to three fp32 roundings, so the int8-fbgemm bound holds
row by row (module docstring of kernels.greedy_head): |l_j - y.w_j| <= a with
  a = (||y|| + ||y - y'||) (max ||w_j - w'_j|| + 2^-20 max ||w'_j||) + ||y - y'|| max ||w_j||.
Token j can be the fp32 argmax only if l_j + a >= best - a: the kernel returns exactly the
tokens with l_j >= best - 2a (their approximate logits need no output rounding).

Why on AVX2-only CPUs: fbgemm's int8 GEMM ran at about half this kernel's multiply rate on a
2-core Zen 3 EPYC and writes all 32 x 129k logits, which are then rounded, maximised and read
again (bench/offline.py measures the decode step it is part of). Rows are vector lanes here, so
a few rows waste most of each vector: `auto` times it per row count beside the other heads.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from deepring.kernels.dispatch import cpu_kernel, use_numba, weight_array
from deepring.kernels.greedy import finite_absmax, int8_weight, row_norm

ROW_MAX = 63  # the kernel's _Int8Head.ROW_MAX (checked at construction)


@functools.cache
def _native():
    try:
        from deepring_recipe._native import _Int8Head
    except ImportError:
        return None
    return _Int8Head


@functools.cache
def cpu_int8_avx2() -> bool:
    """Whether the native module has the kernel and this CPU runs its AVX2 path."""
    cls = _native()
    return cls is not None and bool(cls.has_avx2())


def _array(raw: bytes, dtype) -> np.ndarray:
    return np.frombuffer(raw, dtype)


@cpu_kernel
def _quantize_kernel(y, res_term, w_max, q, x, a):
    """Int8Avx2Logits._quantize's torch path in one pass per row; False for a non-finite y."""
    n, k = y.shape
    rt = np.float32(res_term)
    wm = np.float32(w_max)
    for r in range(n):
        top = finite_absmax(y[r])
        if top < 0:
            return False
        s = top / np.float32(ROW_MAX) if top > 0 else np.float32(1.0)
        x[r] = s
        y_ss = np.float32(0.0)
        res_ss = np.float32(0.0)
        for i in range(k):
            qi = min(max(np.round(y[r, i] / s), np.float32(-ROW_MAX)), np.float32(ROW_MAX))
            q[r, i] = np.int8(qi)
            d = y[r, i] - qi * s
            y_ss += y[r, i] * y[r, i]
            res_ss += d * d
        res = np.sqrt(res_ss)
        a[r] = (np.sqrt(y_ss) + res) * rt + res * wm
    return True


@cpu_kernel
def _settle_kernel(rows, tokens, y, w, idx):
    """idx[r] = the candidate of row r with the largest fp32 logit (lowest id on ties); rows with
    no candidate (or only non-finite logits) keep the value idx held."""
    best = np.full(idx.shape[0], -np.inf, np.float32)
    for c in range(rows.shape[0]):
        r, j = rows[c], tokens[c]
        exact = np.float32(0.0)
        for i in range(y.shape[1]):
            exact += w[j, i] * y[r, i]
        if exact > best[r] or (exact == best[r] and j < idx[r]):
            best[r] = exact
            idx[r] = j


def _settle_torch(r: np.ndarray, j: np.ndarray, y: torch.Tensor, w: torch.Tensor, idx) -> None:
    """_settle_kernel by torch ops."""
    r = torch.from_numpy(r.astype(np.int64))
    j = torch.from_numpy(j.astype(np.int64))
    exact = (w.index_select(0, j) * y.index_select(0, r)).sum(-1)
    top = torch.full((y.shape[0],), float("-inf")).scatter_reduce(0, r, exact, "amax")
    win = exact == top[r]
    idx.scatter_reduce_(0, r[win], j[win], "amin")


class Int8Avx2Logits:
    """The int8-avx2 head's weight copy. `argmax` settles rows through the kernel's candidates;
    calling it gives the approximate logits themselves (rows a grammar constrains, and the
    bound's tests), rounded to bf16 as the other heads give them."""

    def __init__(self, w: torch.Tensor) -> None:
        cls = _native()
        if cls is None or cls.ROW_MAX != ROW_MAX:
            raise ValueError("the int8-avx2 greedy head needs deepring_recipe's _Int8Head kernel")
        q, scale, (self.w_max, self.lp_max, self.res_max) = int8_weight(w)
        self.vocab, self.k = w.shape
        q8 = q.to(torch.int8).numpy().tobytes()
        self._head = cls(q8, scale.float().numpy().tobytes(), self.vocab, self.k)

    def _quantize(self, y: torch.Tensor):
        """(int8 rows [R, K], their scales x [R] fp32, the bound a per row), or None for a
        non-finite y."""
        res_term = self.res_max + 2.0**-20 * self.lp_max
        if use_numba(y):
            y = y.contiguous()
            q = torch.empty(y.shape, dtype=torch.int8)
            x, a = torch.empty(y.shape[0]), torch.empty(y.shape[0])
            ok = _quantize_kernel(y.numpy(), res_term, self.w_max, q.numpy(), x.numpy(), a.numpy())
            return (q, x, a) if ok else None
        if not bool(torch.isfinite(y).all()):
            return None
        top = y.abs().amax(-1)
        x = torch.where(top > 0, top / ROW_MAX, torch.ones_like(top))  # fp32, as used below
        q = torch.round(y / x[:, None]).clamp_(-ROW_MAX, ROW_MAX)
        r = row_norm(y - q * x[:, None])
        a = (row_norm(y) + r) * res_term + r * self.w_max
        return q.to(torch.int8), x, a

    def __call__(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """bf16 approximate logits [R, V] and the bound a of each row; None for a non-finite y."""
        quantized = self._quantize(y)
        if quantized is None:
            return None
        q, x, a = quantized
        raw = self._head.logits(
            q.numpy().tobytes(), y.shape[0], x.numpy().tobytes(), torch.get_num_threads()
        )
        out = torch.from_numpy(_array(raw, np.float32).copy()).view(y.shape[0], self.vocab)
        return out.to(torch.bfloat16), a

    def argmax(self, y: torch.Tensor, w: torch.Tensor, margin: float) -> torch.Tensor | None:
        """The fp32 argmax of each row (first maximum), or None for a non-finite y."""
        quantized = self._quantize(y)
        if quantized is None:
            return None
        q, x, a = quantized
        a = (a.double() * margin).numpy()
        # A bound past fp64's range (rows near fp32's limit) leaves no threshold: plain GEMM.
        plain = ~np.isfinite(a)
        n = y.shape[0]
        best, lost, rows, tokens, _values = self._head.candidates(
            q.numpy().tobytes(), n, x.numpy().tobytes(), np.where(plain, 0.0, a).tobytes(),
            torch.get_num_threads(),
        )  # fmt: skip
        # Logits past fp32's range, or too many candidates (a loose bound): the plain GEMM.
        plain |= ~np.isfinite(_array(best, np.float32)) | (_array(lost, np.uint8) != 0)
        # Usually a few candidates per row; their fp32 logits decide (lowest id on ties).
        r, j = _array(rows, np.uint32), _array(tokens, np.uint32)
        idx = torch.full((n,), self.vocab, dtype=torch.long)
        if use_numba(y) and w.dtype == torch.float32:
            _settle_kernel(r, j, y.contiguous().numpy(), weight_array(w), idx.numpy())
        else:
            _settle_torch(r, j, y, w, idx)
        redo = torch.from_numpy(plain) | (idx == self.vocab)
        if bool(redo.any()):
            idx[redo] = F.linear(y[redo], w).argmax(-1)
        return idx
