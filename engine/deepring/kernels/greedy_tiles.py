"""The int8-avx2 greedy head (kernels.greedy_head): int8 logits whose tile maxima come from our
own AVX2 kernel (`deepring_recipe._native._Int8Head`, crates/kernels/src/int8_head.rs), so the
logits themselves never reach memory.

The weight is quantised per vocabulary row as for the int8 heads (w'_j = s_j q_j, s_j =
max|w_j| / 127) and the batch's rows with one scale x to the whole int8 range (y' = x q,
|q| <= 127: `vpmaddwd` multiplies int16 pairs, so nothing saturates). The kernel's logit
f32(q . q_j) * (x * s_j) is y'.w'_j up to three fp32 roundings, so the int8-fbgemm bound holds
(module docstring of kernels.greedy_head): |l_j - y.w_j| <= a with
  a = (||y|| + ||y - y'||) (max ||w_j - w'_j|| + 2^-20 max ||w'_j||) + ||y - y'|| max ||w_j||,
and there is no output rounding. Token j can be the fp32 argmax only if l_j + a >= best - a, so
only tiles whose maximum reaches best - 2a are searched: their tokens' fp32 logits, from one
batched GEMM, and the largest (lowest id on ties) wins.

Ad-hoc timing on the 2-core AVX2-only AMD EPYC (32 rows of the tiny model's 129k x 128 head):
the whole head 3.4 ms against 7.5-7.8 ms for int8-fbgemm (fbgemm's GEMM alone 5.0 ms, its
output rounded to bf16 and settled 2.5 ms more).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from deepring.kernels.dispatch import HAVE_NUMBA, parallel_threads
from deepring.kernels.greedy import MAX_TILES

TILE = 128  # tokens per tile (the kernel's _Int8Head.TILE, checked at construction)


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


@functools.cache
def _parts_kernel():
    """A numba kernel that runs the tile maxima in parts on OpenMP's threads, which numba shares
    with torch (kernels.dispatch), through the kernel's C entry; None without numba. Threads of
    the kernel's own would share the cores with torch's, which spin-wait after each op: ad-hoc
    timing on the 2-core AVX2 EPYC, 32 rows right after a torch op, 11.6 ms on two threads of
    its own against 4.7 ms with the cores to itself. (Compiled per process, ~0.2 s: a function
    pointer cannot go into numba's disk cache.)"""
    if not HAVE_NUMBA or _native() is None:
        return None
    import ctypes

    import numba
    from deepring_recipe import _native as native

    fn = ctypes.CDLL(native.__file__).deepring_int8_head_tile_max_part
    fn.argtypes = [ctypes.c_size_t] * 3 + [ctypes.c_float] + [ctypes.c_size_t] * 3
    fn.restype = ctypes.c_int32

    @numba.njit(parallel=True, nogil=True)
    def run(head, pairs, rows, x, out, parts):
        failed = 0
        for p in numba.prange(parts):
            if fn(head, pairs, rows, x, out, p, parts) != 0:
                failed += 1
        return failed

    return run


def _row_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def _floats(raw: bytes, *shape: int) -> torch.Tensor:
    """The kernel's fp32 output bytes as a tensor of `shape` (a copy: bytes are read-only)."""
    return torch.from_numpy(np.frombuffer(raw, np.float32).copy()).view(*shape)


def _u32(t: torch.Tensor) -> bytes:
    return t.to(torch.int32).numpy().tobytes()  # (non-negative values: uint32's bytes)


class Int8TileLogits:
    """The int8-avx2 head's weight copy: `argmax` finds the fp32 argmax through tile maxima;
    calling it gives the approximate logits themselves (for rows a grammar constrains, and the
    bound's tests), rounded to bf16 as the other heads give them."""

    def __init__(self, w: torch.Tensor) -> None:
        cls = _native()
        if cls is None or cls.TILE != TILE:
            raise ValueError("the int8-avx2 greedy head needs deepring_recipe's _Int8Head kernel")
        scale = w.abs().amax(-1) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row
        q = torch.round(w / scale[:, None]).clamp_(-127, 127)
        lp = q * scale[:, None]
        self.w_max = float(_row_norm(w).max())
        self.lp_max = float(_row_norm(lp).max())
        self.res_max = float(_row_norm(w - lp).max())
        self.vocab, self.k = w.shape
        qb = q.to(torch.int8).numpy().tobytes()
        self._head = cls(qb, scale.float().numpy().tobytes(), self.vocab, self.k)

    def _quantize(self, y: torch.Tensor):
        """(int16 row values [R, K], their scale x, the bound a per row), or None for a
        non-finite y."""
        if not bool(torch.isfinite(y).all()):
            return None
        top = float(y.abs().max())
        x = float(np.float32(top / 127)) if top > 0 else 1.0
        q = torch.round(y / x).clamp_(-127, 127)
        r = _row_norm(y - q * x)
        a = (_row_norm(y) + r) * (self.res_max + 2.0**-20 * self.lp_max) + r * self.w_max
        return q.to(torch.int16).numpy(), x, a

    def _tile_max(self, q: np.ndarray, x: float) -> torch.Tensor:
        """Each tile's largest approximate logit of each row: [R, tiles]."""
        n = q.shape[0]
        threads = parallel_threads()
        kernel = _parts_kernel() if threads > 1 else None
        if kernel is None:
            raw = self._head.tile_max(q.tobytes(), n, x, 1)
            return _floats(raw, -1, n).T
        if q.shape[1] % 2:  # the kernel reads column pairs: a zero column completes the last
            q = np.concatenate([q, np.zeros((n, 1), np.int16)], 1)
        pairs = np.ascontiguousarray(q).view(np.int32)
        out = np.empty((self._head.tiles, n), np.float32)
        import numba

        if numba.get_num_threads() != threads:
            numba.set_num_threads(threads)
        if kernel(self._head.address, pairs.ctypes.data, n, x, out.ctypes.data, threads):
            raise RuntimeError("the int8-avx2 tile kernel refused its arguments")
        return torch.from_numpy(out).T

    def __call__(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """bf16 approximate logits [R, V] and the bound a of each row; None for a non-finite y."""
        quantized = self._quantize(y)
        if quantized is None:
            return None
        q, x, a = quantized
        raw = self._head.logits(q.tobytes(), y.shape[0], x)
        out = _floats(raw, y.shape[0], self.vocab)
        return out.to(torch.bfloat16), a

    def argmax(self, y: torch.Tensor, w: torch.Tensor, margin: float):
        """(the fp32 argmax of each row, the bound a * margin), or None for a non-finite y."""
        quantized = self._quantize(y)
        if quantized is None:
            return None
        q, x, a = quantized
        a = a * margin
        tmax = self._tile_max(q, x)
        # In fp64: the threshold's own rounding stays far below a's margin.
        thr = tmax.amax(-1).double() - 2 * a.double()
        reach = tmax.double() >= thr[:, None]
        # (Logits past fp32's range leave no finite threshold: those rows take the plain GEMM.)
        plain = ~torch.isfinite(thr) | (reach.sum(-1) > MAX_TILES)
        if bool(plain.any()):
            reach[plain] = False
        idx = self._settle(y, w, q.tobytes(), x, reach, thr)
        if bool(plain.any()):
            idx[plain] = F.linear(y[plain], w).argmax(-1)
        return idx, a

    def _settle(self, y, w, qb: bytes, x: float, reach: torch.Tensor, thr: torch.Tensor):
        """The fp32 argmax of each row over the tokens of the tiles `reach` [R, tiles] marks
        whose approximate logit reaches the row's threshold (first maximum; rows with no tile
        marked get the vocabulary size)."""
        n = y.shape[0]
        rt, tt = reach.nonzero(as_tuple=True)
        raw = self._head.tile_values(qb, n, x, _u32(rt), _u32(tt))
        values = _floats(raw, len(rt), TILE)
        p, j = (values.double() >= thr.index_select(0, rt)[:, None]).nonzero(as_tuple=True)
        r, tok = rt[p], tt[p] * TILE + j
        # Usually one candidate per row; ties leave a few, settled by their fp32 logits.
        exact = (w.index_select(0, tok) * y.index_select(0, r)).sum(-1)
        top = torch.full((n,), float("-inf")).scatter_reduce(0, r, exact, "amax")
        win = exact == top[r]
        return torch.full((n,), self.vocab, dtype=torch.long).scatter_reduce(
            0, r[win], tok[win], "amin"
        )
