"""Compile the numba CPU kernels when a model loads, not in its first request.

numba compiles a kernel on its first call (ad-hoc timing, 2-core dev machine: about 11 s for
all of them, half of it for the row-parallel variants) or loads it from its disk cache (about
0.2 s). Each kernel is called here once on tiny inputs of the argument types a model step
passes, so that cost lands in model loading; the row-parallel variants only where a step would
use them (dispatch.parallel_threads).
"""

from __future__ import annotations

import numpy as np
import torch

from deepring.kernels.attention_decode import decode_plan
from deepring.kernels.attention_decode_numba import decode_attention_numba
from deepring.kernels.attention_prefill import SeqLayout
from deepring.kernels.dispatch import parallel_threads, use_numba
from deepring.kernels.greedy import quantize_rows_numba, settle_numba
from deepring.kernels.greedy_masked import masked_settle, walk_settle
from deepring.kernels.hyper import hc_merge_numba, hc_pre_numba
from deepring.kernels.indexer import indexer_topk_numba
from deepring.kernels.moe_numba import MoEPacked, moe_rows_numba, route_numba
from deepring.kernels.rmsnorm import rms_norm_numba
from deepring.kernels.rope import apply_rope, norm_rope

# Rows for the second round, which compiles the row-parallel kernels: enough for every kernel
# to split (dispatch.run_rows), few enough to cost nothing.
_PARALLEL_ROWS = 128


def warm_up_cpu_kernels() -> None:
    if not use_numba(torch.zeros(1)):
        return
    _warm_up(1)
    if parallel_threads() > 1:
        _warm_up(_PARALLEL_ROWS)


def _warm_up(n: int) -> None:
    """Each kernel once on n rows (n = 1: the serial kernels)."""
    x = torch.zeros(n, 2, 4)
    m = 4 * 2  # (2 + hc) * hc mixes for hc = 2
    post, comb_t, out = hc_pre_numba(
        x, torch.zeros(m, 8), torch.zeros(m), torch.ones(m), 1, 1e-6, 1e-6
    )
    hc_merge_numba(x, out, post, comb_t)
    rms_norm_numba(out, torch.ones(4), 1e-6)
    rms_norm_numba(out, None, 1e-6)
    if n == 1:  # no row-parallel variant
        logits = torch.zeros(1, 4)
        route_numba(logits, "sqrtsoftplus", torch.zeros(4), None, 2, 1.0)
        route_numba(logits, "sqrtsoftplus", None, torch.zeros(1, 2, dtype=torch.long), 2, 1.0)
        quantize_rows_numba(x[0], 1.0, 1.0)
        one = torch.zeros(1, dtype=torch.long)
        decode_plan(one, one, torch.zeros(1, 1, dtype=torch.long), 4, 2, (4, 4), True)
        # A grammar-constrained greedy row: the masked settle and the matcher walk.
        approx, w64 = torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(64, 4)
        approx[0, 0] = 1.0  # (one clear winner: the walk reaches its fp32 comparison)
        words = np.zeros((1, 2), dtype=np.int32)
        words[0, 0] = 1
        masked_settle(approx, torch.zeros(1), x[:, 0], w64, [0], words, 64)
        walk_settle(approx, torch.zeros(1), x[:, 0], w64, 0, lambda t: True, 4)
    # cos and sin as a step passes them on CPU: strided views of its complex rotations (with
    # one row and one column numpy would call them contiguous, another compiled signature).
    x2 = torch.zeros(n + 1, 2, 4)
    cis = torch.ones(n + 1, 2, dtype=torch.complex64)
    norm_rope(x2, torch.ones(4), 1e-6, cis.real, cis.imag)
    norm_rope(x2, None, 1e-6, cis.real, cis.imag)
    apply_rope(x2, cis.real, cis.imag, inplace=True)
    settle_numba(
        torch.zeros(n, 4, dtype=torch.bfloat16), torch.zeros(n), x[:, 0], torch.zeros(4, 4)
    )
    w4 = torch.zeros(4, 4)
    packed = MoEPacked().prepare(
        torch.zeros(2, 4, 4), torch.zeros(2, 4, 2), w4[:2], w4[:2], w4[:, :2], 1.0
    )
    moe_rows_numba(
        packed.project(out), torch.zeros(n, 2, dtype=torch.long), torch.ones(n, 2), packed
    )
    rows = torch.arange(n)
    lay = SeqLayout(list(range(n)), [1] * n, [3] * n, rows, rows[:, None], rows, rows * 0 + 3,
                    rows * 0 + 3, rows)  # fmt: skip
    indexer_topk_numba(x, x[:, :, 0], torch.zeros(n, 4, 4), lay, 4, 1, 1.0)
    decode_attention_numba(x, x[:, 0], torch.zeros(n, 4, 4), torch.zeros(n, 4, 4), rows * 0 + 3,
                           rows, rows[:, None], None, 4, torch.zeros(2), 1.0, 2)  # fmt: skip
