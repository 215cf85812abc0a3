"""Greedy decoding's LM head: the argmax of fp32 logits without the logits. `GreedyArgmax` is the
entry point; on CPU it finds the argmax through a low-precision GEMM where that is fast.

An fp32 LM head is the largest single cost of a small model's CPU decode step, and it is bound by
reading the weight. CPUs with AMX or VNNI run the same GEMM in int8 or bf16 several times faster
and read a half or a quarter of the bytes, but their logits are approximate. A rigorous bound on
their error says which tokens could still be the fp32 argmax: those whose approximate logit, plus
its bound, reaches the approximate maximum minus its bound. Only these (usually just the
approximate winner) get their fp32 logit, and the largest of those (lowest id on ties) wins: the
result is the fp32 argmax, not an approximation of it.

For a row y (fp32) against weight row w_j (fp32), with y', w'_j the low-precision stand-ins the
GEMM multiplies exactly, y.w_j - y'.w'_j = (y - y').w_j + y'.(w_j - w'_j), so by Cauchy-Schwarz
the approximate logit l_j (rounded to bf16 on output) satisfies |l_j - y.w_j| <= A + u' |l_j|:
  A = ||y'|| * max_j ||w_j - w'_j|| + ||y - y'|| * max_j ||w_j||      (input rounding)
      + c * ||y'|| * max_j ||w'_j||                                   (fp32 arithmetic in the GEMM)
  u' = 2^-8 / (1 - 2^-8)                                              (bf16 output rounding)
- bf16: y', w' are the bf16 roundings; their products are exact in fp32, the K-term sum is not:
  c = K * 2^-23.
- int8 (oneDNN's quantized linear): w'_j = s_j q_j with a per-row scale s_j = max|w_j| / 127,
  y' = x q_y with one scale x for the batch; the integer sum is exact and the two scales are
  applied in fp32: c = 2^-20 covers those few roundings, the int32 -> fp32 conversion, and the
  fp32 products that stand for y' and w' in the norms.
- int8-fbgemm (fbgemm's int8 GEMM, `quantized::linear_with_input_q_dq_qweight_dq_output_fp32`,
  which takes the rows' quantisation from the caller): w' as for int8; the rows are quantised
  here to 7 bits around zero point 64 (y' = x (q - 64), |q - 64| <= 63: AVX2's u8 x s8 pair
  products then never saturate their int16 sums), so y' is known; c = 2^-20 as for int8, and
  ||y|| + ||y - y'|| stands for ||y'|| (it bounds it whichever way the kernel rounds a tie).
  It needs no VNNI or AMX.
- fp16 (fbgemm's fp16 GEMM, `quantized::linear_dynamic_fp16`): w' is the fp16 rounding of w,
  decoded to fp32 in the kernel and multiplied with fp32 FMAs: c = K * 2^-23 as for bf16. The
  rows should stay fp32 there; the bound does not rely on it: with y16 the rows' fp16 rounding
  and d = ||y - y16||, A = (||y|| + d) * (max ||w_j - w'_j|| + c max ||w'_j||) + d * max ||w_j||
  holds whether the kernel reads y or y16. It needs no int8 or bf16 instructions (AVX2 and
  F16C): the fast head of CPUs without VNNI, AMX or native bf16, where it reads half the fp32
  head's bytes and runs the same FMAs.
- int8-avx2 (our AVX2 kernel, kernels.greedy_int8): w' as for int8, each row quantised to 7 bits
  with a scale of its own; the int8-fbgemm bound row by row, and no output rounding (the kernel
  returns the candidates themselves, not logits).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from deepring import env
from deepring.kernels.dispatch import use_numba
from deepring.kernels.greedy import int8_weight, quantize_rows, row_norm, settle, weight_norms
from deepring.kernels.greedy_choice import HeadChoice, measure
from deepring.kernels.greedy_choice_cache import cached_choice
from deepring.kernels.greedy_int8 import Int8Avx2Logits, cpu_int8_avx2
from deepring.kernels.greedy_masked import masked_settle, walk_settle

# The bound is itself computed in fp32; a margin far above those roundings keeps it an upper bound.
_MARGIN = 1 + 2.0**-8


def _cpu_has(*names: str) -> bool:
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in names)


@functools.cache
def cpu_int8_is_fast() -> bool:
    """Whether oneDNN's quantized linear is in this build and the CPU has int8 dot products
    (VNNI or AMX)."""
    ops = getattr(torch.ops, "onednn", None)
    try:
        has_op = ops is not None and hasattr(ops, "qlinear_prepack")
    except (AttributeError, RuntimeError):
        has_op = False
    return has_op and _cpu_has("_is_vnni_supported", "_is_amx_tile_supported")


FP16_MAX = 65504.0  # the largest finite fp16


@functools.cache
def cpu_fp16_gemm() -> bool:
    """Whether this torch has fbgemm's fp16 GEMM (x86 builds) and it runs here."""
    ops = torch.ops.quantized
    try:
        w = torch.ones(2, 8)
        out = ops.linear_dynamic_fp16(torch.ones(1, 8), ops.linear_prepack_fp16(w, None))
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return bool(torch.equal(out, torch.full((1, 2), 8.0)))


INT8_ZERO = 64  # the int8-fbgemm head's zero point for the rows (7 bits: 1 .. 127)
FBGEMM_TILE = 8192  # vocabulary rows per packed tile of the int8-fbgemm head


@functools.cache
def cpu_int8_fbgemm() -> bool:
    """Whether this torch has fbgemm's int8 linear with caller-given row quantisation (x86
    builds) and it computes what the int8-fbgemm head's bound assumes."""
    ops = torch.ops.quantized
    w = torch.tensor([[1.0, -2.0], [0.5, 1.0]])
    try:
        scales = torch.tensor([2 / 127, 1 / 127], dtype=torch.double)
        qw = torch.quantize_per_channel(w, scales, torch.zeros(2, dtype=torch.long), 0, torch.qint8)
        x = torch.tensor([[63.0, -63.0]])
        out = ops.linear_with_input_q_dq_qweight_dq_output_fp32(
            x, 1.0, INT8_ZERO, ops.linear_prepack(qw, None)
        )
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return bool(torch.allclose(out, x @ qw.dequantize().T, rtol=1e-6))


def head_setting() -> str:
    """DEEPRING_GREEDY_HEAD: 'auto' (the head measured fastest on the weight, per batch size:
    kernels.greedy_choice), or a forced 'int8' / 'bf16' / 'fp32'. A forced int8 needs oneDNN's
    int8 linear and VNNI or AMX (elsewhere it is an error, not a silent fallback)."""
    choice = env.greedy_head()
    if choice == "int8" and not cpu_int8_is_fast():
        raise ValueError("DEEPRING_GREEDY_HEAD=int8 needs oneDNN's int8 linear and VNNI or AMX")
    if choice == "int8-fbgemm" and not cpu_int8_fbgemm():
        raise ValueError(
            "DEEPRING_GREEDY_HEAD=int8-fbgemm needs fbgemm's int8 linear (an x86 torch)"
        )
    if choice == "int8-avx2" and not cpu_int8_avx2():
        raise ValueError(
            "DEEPRING_GREEDY_HEAD=int8-avx2 needs deepring_recipe's int8 head kernel and AVX2"
        )
    if choice == "fp16" and not cpu_fp16_gemm():
        raise ValueError("DEEPRING_GREEDY_HEAD=fp16 needs fbgemm's fp16 GEMM (an x86 torch)")
    return choice


def auto_candidates() -> tuple[str, ...]:
    """The heads `auto` measures: fp32 and bf16 always (bf16 also pays where the CPU emulates
    it: it halves the bytes read when few rows make the head read-bound), fp16 and int8-fbgemm
    where fbgemm is in the build (any x86 CPU), int8 where the CPU has int8 dot products (VNNI or
    AMX; elsewhere oneDNN's int8 linear is far slower), int8-avx2 where our kernel runs (AVX2:
    kernels.greedy_int8)."""
    kinds = ("fp32", "bf16") + (("fp16",) if cpu_fp16_gemm() else ())
    kinds += ("int8-fbgemm",) if cpu_int8_fbgemm() else ()
    kinds += ("int8-avx2",) if cpu_int8_avx2() else ()
    return kinds + (("int8",) if cpu_int8_is_fast() else ())


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


def packed_linear(w16: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ w16.T with the weight reordered for oneDNN once (see _packed_gemm): for
    callers that want a low-precision GEMM's whole output, not just its argmax."""
    return _packed_gemm(w16)


class _Bf16Logits:
    """Approximate logits from a pre-packed bf16 copy of the weight."""

    def __init__(self, w: torch.Tensor) -> None:
        w16 = w.to(torch.bfloat16)
        self.w_max, self.lp_max, self.res_max = weight_norms(w, w16.float())
        self._gemm = _packed_gemm(w16)

    def __call__(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """bf16 logits [R, V] and the bound A of each row; None for a non-finite y."""
        if not bool(torch.isfinite(y).all()):
            return None
        y16 = y.to(torch.bfloat16)
        y16f = y16.float()
        lp_n = row_norm(y16f)
        arith = y.shape[1] * 2.0**-23 * self.lp_max
        a = lp_n * (self.res_max + arith) + row_norm(y - y16f) * self.w_max
        return self._gemm(y16), a


class _Int8Logits:
    """Approximate logits from oneDNN's int8 linear: weight rows scaled to int8 once, the
    batch's rows quantised with one scale per call; output in bf16. Ad-hoc timing on the 2-core
    dev machine, 32 rows of the tiny model's 129k x 128 head: 1.1-1.3 ms against 1.7-2.0 ms
    for the pre-packed bf16 GEMM, with the caches cold as they are in a decode step."""

    def __init__(self, w: torch.Tensor) -> None:
        q, scale, (self.w_max, self.lp_max, self.res_max) = int8_weight(w)
        self._scale = scale.contiguous()
        self._zero = torch.zeros(w.shape[0], dtype=torch.long)
        self._packed = torch.ops.onednn.qlinear_prepack(q.to(torch.int8), None)

    def __call__(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        quantized = quantize_rows(y, self.res_max + 2.0**-20 * self.lp_max, self.w_max)
        if quantized is None:  # a non-finite row
            return None
        q, x, a = quantized
        approx = torch.ops.onednn.qlinear_pointwise(
            q, x, 0, self._packed, self._scale, self._zero, None, 1.0, 0, torch.bfloat16,
            "none", [], "",
        )  # fmt: skip
        return approx, a


class _Fp16Logits:
    """Approximate logits from fbgemm's fp16 GEMM over a packed fp16 copy of the weight (the
    module docstring's fp16 bound); output rounded to bf16 for the settle."""

    def __init__(self, w: torch.Tensor) -> None:
        if not bool(torch.isfinite(w).all()) or float(w.abs().max()) >= FP16_MAX:
            raise ValueError("the fp16 greedy head needs a finite weight within fp16's range")
        self.w_max, self.lp_max, self.res_max = weight_norms(w, w.half().float())
        self._packed = torch.ops.quantized.linear_prepack_fp16(w.contiguous(), None)

    def __call__(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not bool(torch.isfinite(y).all()) or float(y.abs().max()) >= FP16_MAX:
            return None  # (a row past fp16's range: the plain path)
        d = row_norm(y - y.half().float())
        arith = y.shape[1] * 2.0**-23 * self.lp_max
        a = (row_norm(y) + d) * (self.res_max + arith) + d * self.w_max
        approx = torch.ops.quantized.linear_dynamic_fp16(y.contiguous(), self._packed)
        return approx.to(torch.bfloat16), a


class _Int8FbgemmLogits:
    """Approximate logits from fbgemm's int8 linear (the module docstring's int8-fbgemm bound):
    weight rows scaled to int8 once as for int8, the batch's rows quantised here to 7 bits with
    one scale; output rounded to bf16 for the settle."""

    def __init__(self, w: torch.Tensor) -> None:
        _q, scale, (self.w_max, self.lp_max, self.res_max) = int8_weight(w)
        # Packed in vocabulary tiles: each tile's fp32 output is rounded to bf16 while it is in
        # cache (the whole fp32 output, written then read back, cost as much as the GEMM in
        # an ad-hoc timing on a 2-core AVX2 EPYC, 32 rows of a 129k head).
        self._tiles = []
        for start in range(0, w.shape[0], FBGEMM_TILE):
            part = slice(start, start + FBGEMM_TILE)
            zeros = torch.zeros(w[part].shape[0], dtype=torch.long)
            qw = torch.quantize_per_channel(w[part], scale[part].double(), zeros, 0, torch.qint8)
            self._tiles.append((start, torch.ops.quantized.linear_prepack(qw, None)))
        self._vocab = w.shape[0]

    def __call__(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not bool(torch.isfinite(y).all()):
            return None
        top = float(y.abs().max())
        x = top / (127 - INT8_ZERO) if top > 0 else 1.0
        lp = torch.round(y / x).clamp_(INT8_ZERO - 127, 127 - INT8_ZERO) * x
        r = row_norm(y - lp)
        a = (row_norm(y) + r) * (self.res_max + 2.0**-20 * self.lp_max) + r * self.w_max
        # (A new tensor per call: a masker keeps a call's logits while later calls run.)
        out = torch.empty(y.shape[0], self._vocab, dtype=torch.bfloat16)
        y = y.contiguous()
        gemm = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32
        for start, packed in self._tiles:
            part = gemm(y, x, INT8_ZERO, packed)
            out[:, start : start + part.shape[1]] = part
        return out, a


_KINDS = {
    "bf16": _Bf16Logits,
    "int8": _Int8Logits,
    "int8-fbgemm": _Int8FbgemmLogits,
    "int8-avx2": Int8Avx2Logits,
    "fp16": _Fp16Logits,
}


class GreedyHead:
    """Holds the low-precision copy of an fp32 LM head weight and its norms; rebuilt when the
    weight changes (tracked by data pointer and version counter). kind: one of _KINDS."""

    def __init__(self, kind: str) -> None:
        if kind not in _KINDS:
            raise ValueError(f"greedy head kind must be one of {sorted(_KINDS)}, got {kind!r}")
        self.kind = kind
        self._key: tuple[int, int] | None = None
        self._logits = None  # the kind's approximate logits (_KINDS), for the prepared weight
        # The last call's approximate logits, bounds and rows, kept for `MaskedGreedy`: a
        # grammar-constrained row whose argmax its grammar refuses is settled again from them
        # under its mask instead of paying for its whole fp32 logits row.
        # (int8-avx2, which settles without them, keeps what computes them: _LazyLast.)
        self.last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | _LazyLast | None = None

    def prepare(self, w: torch.Tensor) -> None:
        key = (w.data_ptr(), w._version)
        if self._key != key:
            self._logits = _KINDS[self.kind](w.detach().float())
            self._key = key

    def argmax(self, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """argmax_j (y @ w.T)[r, j] in fp32 for each row r (first maximum); y: [R, K]."""
        self.prepare(w)
        y = y.float()
        if isinstance(self._logits, Int8Avx2Logits):
            # Settled inside; its approximate logits are computed only if a grammar refuses a
            # row's argmax (MaskedGreedy), not in every step.
            idx = self._logits.argmax(y, w, _MARGIN)
            if idx is None:  # a non-finite row
                self.last = None
                return F.linear(y, w.float()).argmax(-1)
            self.last = _LazyLast(self._logits, y)
            return idx
        logits = self._logits(y)
        if logits is None:  # a non-finite row: no bound holds, the plain path says what fp32 does
            self.last = None
            return F.linear(y, w.float()).argmax(-1)
        approx, a = logits
        self.last = (approx, a * _MARGIN, y)
        return settle(approx, self.last[1], y, w)


@dataclass(frozen=True)
class _LazyLast:
    """GreedyHead.last of a head that settles inside (int8-avx2): its rows, and its approximate
    logits of them only when first asked for, with the bound widened as `argmax` widens it."""

    logits: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    y: torch.Tensor

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        approx, a = self.logits(self.y)  # (y is finite: argmax returned None otherwise)
        return approx, a * _MARGIN, self.y


class MaskedGreedy:
    """One greedy-head call's approximate logits and bounds (GreedyHead.last), settled again
    for rows whose argmax a grammar refuses (kernels.greedy_masked): exact, without their fp32
    logits rows."""

    # Tokens a walk checks before it gives up (the caller then computes the row's mask).
    WALK = 64

    def __init__(self, last, w: torch.Tensor) -> None:
        # (approx, a, y), or a _LazyLast that computes approx and a when first needed
        self._last = last
        self.y = last.y if isinstance(last, _LazyLast) else last[2]
        self.w = w

    def _resolve(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if isinstance(self._last, _LazyLast):
            self._last = self._last()
        return self._last

    @property
    def approx(self) -> torch.Tensor:
        return self._resolve()[0]

    @property
    def a(self) -> torch.Tensor:
        return self._resolve()[1]

    def __call__(self, rows: list[int], words: np.ndarray, limit: int) -> list:
        """Each row's fp32 argmax among the tokens its packed mask allows (words [len(rows),
        W] int32, bit j & 31 of word j >> 5; only tokens below `limit`; first maximum), or
        None where this cannot tell."""
        return masked_settle(self.approx, self.a, self.y, self.w, rows, words, limit)

    def walk(self, row: int, allows: Callable[[int], bool]) -> int | None:
        """Row `row`'s fp32 argmax among the tokens `allows` accepts, found among its WALK
        largest approximate logits, or None (where it may lie beyond them, or numba is
        not here to rank them)."""
        if not use_numba(self.y):
            return None
        return walk_settle(self.approx, self.a, self.y, self.w, row, allows, self.WALK)


# Vocabulary tile of the fp32 path: a tile's logits stay in cache while its max is taken.
GREEDY_TILE = 16384
# Up to this many rows the whole logits matrix is small and one GEMM is faster than tiles.
GREEDY_FULL_ROWS = 16


class GreedyArgmax:
    """argmax_j (y @ w.T)[r, j] (first maximum) for an LM head weight w: on CPU with an fp32
    weight, the head DEEPRING_GREEDY_HEAD names or (auto) the one measured fastest on this
    weight for the step's row count (kernels.greedy_choice); elsewhere the fp32 logits, in
    vocabulary tiles with a running maximum beyond a few rows."""

    def __init__(self) -> None:
        self.heads: dict[str, GreedyHead] = {}
        self.choice: HeadChoice | None = None  # auto's measurement, once the weight is known
        self._used: GreedyHead | None = None  # the low-precision head of the last call, if any

    def _head(self, kind: str) -> GreedyHead:
        if kind not in self.heads:
            self.heads[kind] = GreedyHead(kind)
        return self.heads[kind]

    def _low_precision(self, w: torch.Tensor, rows: int) -> GreedyHead | None:
        if w.dtype != torch.float32 or w.device.type != "cpu":
            return None
        kind = head_setting()
        if kind == "auto":
            kind = self._measured(w).kind(rows)
        return None if kind == "fp32" else self._head(kind)

    def _measured(self, w: torch.Tensor) -> HeadChoice:
        if self.choice is None:
            kinds = auto_candidates()

            def run() -> HeadChoice:
                heads = {"fp32": lambda y: _fp32_argmax(y, w)}
                for kind in kinds[1:]:
                    head = self._head(kind)
                    try:
                        head.prepare(w)  # (its weight copy is built once, not timed)
                    except ValueError:  # a weight this head cannot hold (fp16's range)
                        continue
                    heads[kind] = lambda y, head=head: head.argmax(y, w)
                return measure(heads, w.shape[1])

            self.choice = cached_choice(tuple(w.shape), kinds, run)
        return self.choice

    def prepare(self, w: torch.Tensor) -> None:
        """Measure (auto) and build the low-precision heads' weight copies now (~0.1 s each for
        a 129k vocabulary) rather than in the first greedy steps."""
        if w.dtype != torch.float32 or w.device.type != "cpu":
            return
        kind = head_setting()
        kinds = set(self._measured(w).by_rows.values()) if kind == "auto" else {kind}
        for k in kinds - {"fp32"}:
            self._head(k).prepare(w)

    def masker(self, w: torch.Tensor) -> MaskedGreedy | None:
        """The last call's approximate logits, for rows whose argmax a grammar refuses
        (MaskedGreedy); None when that call had no low-precision head (the caller computes
        those rows' logits)."""
        head = self._used
        last = None if head is None else head.last
        return None if last is None else MaskedGreedy(last, w)

    def __call__(self, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        head = self._low_precision(w, y.shape[0]) if y.shape[0] else None
        self._used = head
        if head is not None:
            return head.argmax(y, w)
        return _fp32_argmax(y, w)


def _fp32_argmax(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if y.shape[0] <= GREEDY_FULL_ROWS:
        # Few rows: one mat-vec over the whole vocabulary beats tiles (measured on CPU).
        return F.linear(y, w).float().argmax(-1)
    best_v = torch.full((y.shape[0],), float("-inf"), device=y.device)
    best_i = torch.zeros(y.shape[0], dtype=torch.long, device=y.device)
    for start in range(0, w.shape[0], GREEDY_TILE):
        v, i = F.linear(y, w[start : start + GREEDY_TILE]).float().max(-1)
        better = v > best_v  # strict: an earlier tile keeps ties (first maximum wins)
        best_v = torch.where(better, v, best_v)
        best_i = torch.where(better, i + start, best_i)
    return best_i
