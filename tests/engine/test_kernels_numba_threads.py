"""The numba kernels' compilation at model load and their row-parallel variants: every
variant writes what its serial kernel writes, rows are split only where it pays, and numba's
OpenMP threads leave torch's thread count alone."""

from __future__ import annotations

import contextlib

import pytest
import torch
from deepring.kernels import dispatch
from deepring.kernels.hyper import hc_merge_numba, hc_pre_numba
from numba_cases import decode_case, hc_params

# Each kernel's row-parallel variant is checked against it wherever a test runs it (conftest).
pytestmark = pytest.mark.usefixtures("row_splits_checked")


def test_model_load_compiles_every_kernel_for_the_types_steps_use(monkeypatch):
    """load_model compiles the numba kernels (so the first request does not), for exactly the
    argument types a prefill and a decode step pass: the steps add no compilation, nor does a
    grammar-constrained greedy row (the masked settle and the matcher walk)."""
    import numpy as np
    from deepring.kernels import (
        attention_decode,
        attention_decode_numba,
        greedy,
        greedy_masked,
        hyper,
        indexer,
        moe_numba,
        rmsnorm,
        rope,
    )
    from deepring.model.batch import ForwardBatch, SeqChunk
    from deepring.model.loader import load_model
    from v4_helpers import model_config, pool_for, step

    kernels = [
        hyper._hc_pre_kernel,
        hyper._hc_merge_kernel,
        rmsnorm._rms_norm_numba,
        moe_numba._route_kernel,
        rope._norm_rope_kernel,
        greedy._settle_kernel,
        greedy._quantize_kernel,
        moe_numba._moe_rows_kernel,
        attention_decode._decode_plan_kernel,
        indexer._select_kernel,
        rope._rope_in_place_kernel,
        attention_decode_numba._decode_kernel,
        attention_decode_numba._check,
        greedy_masked._masked_settle_kernel,
        greedy_masked._ranked_kernel,
        greedy_masked._best_of,
    ]
    model = load_model(model_config("swa-csa-hca"), load_format="dummy", device="cpu").model
    compiled = [len(k.signatures) for k in kernels]
    assert all(compiled), compiled
    pool = pool_for(model, num_blocks=8, num_slots=2, block_size=16)
    step(model, pool, [SeqChunk(list(range(5, 25)), 0, 0, [1, 2])])
    step(model, pool, [SeqChunk([7], 20, 0, [1, 2])])
    batch = ForwardBatch.build([SeqChunk([8], 21, 0, [1, 2])], model.rope_tables(), 16, "cpu")
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", "bf16")
    out = model(batch, pool, greedy=True)  # the greedy head's settling kernel
    # A constrained row as TokenMasks.fix_greedy settles it (its buffer rows, fancy-indexed).
    buf = np.zeros((4, (model.config.vocab_size + 31) // 32), dtype=np.int32)
    buf[0, :2] = -1
    assert out.masked_greedy([0], buf[[0]], model.config.vocab_size)[0] is not None
    assert out.masked_greedy.walk(0, lambda t: t < 64) is not None
    assert [len(k.signatures) for k in kernels] == compiled


def test_every_row_parallel_variant_writes_what_its_serial_kernel_writes(row_splits_checked):
    """Random rows through each kernel that has a row-parallel variant; the fixture checks the
    variant (rows cut into 2, 3 and more ranges than rows) against the serial kernel."""
    from deepring.kernels import greedy, indexer, moe_numba
    from deepring.kernels.attention_prefill import SeqLayout
    from deepring.kernels.rmsnorm import rms_norm_numba
    from deepring.kernels.rope import apply_rope, norm_rope

    g = torch.Generator().manual_seed(3)
    rows = 37
    fn, base, scale = hc_params(g, 4, 16)
    h = torch.randn(rows, 4, 16, generator=g) * 3
    post, comb_t, x = hc_pre_numba(h, fn, base, scale, 20, 1e-6, 1e-6)
    hc_merge_numba(h, torch.randn(rows, 16, generator=g), post, comb_t)
    for w in (torch.rand(16, generator=g) + 0.5, None):
        rms_norm_numba(x, w, 1e-6)
        cis = torch.polar(torch.ones(rows, 2), torch.rand(rows, 2, generator=g) * 6)
        norm_rope(h.clone(), w, 1e-6, cis.real, cis.imag)
        apply_rope(h.clone(), cis.real, cis.imag, inplace=True)
    # Greedy settling: bf16 logits of a 300-token head, with a bound that leaves a few
    # candidates per row, and rows of either sign.
    head = torch.randn(300, 16, generator=g)
    y = torch.randn(rows, 16, generator=g)
    y[::5] *= -1
    approx = (y @ head.T).bfloat16()
    greedy.settle_numba(approx, torch.full((rows,), 0.05), y, head)
    experts, inter = 4, 8
    packed = moe_numba.MoEPacked().prepare(
        torch.randn(experts, 2 * inter, 16, generator=g),
        torch.randn(experts, 16, inter, generator=g),
        torch.randn(inter, 16, generator=g),
        torch.randn(inter, 16, generator=g),
        torch.randn(16, inter, generator=g),
        3.0,
    )
    idx = torch.randint(0, experts, (rows, 2), generator=g)
    moe_numba.moe_rows_numba(packed.project(x), idx, torch.rand(rows, 2, generator=g), packed)
    positions = torch.randint(0, 60, (rows,), generator=g)
    seqs = torch.arange(rows)
    lay = SeqLayout(list(range(rows)), [1] * rows, positions.tolist(), seqs,
                    torch.randint(0, 40, (rows, 4), generator=g), seqs, positions, positions,
                    seqs)  # fmt: skip
    cache = torch.randn(40, 4, 8, generator=g)
    indexer.indexer_topk_numba(
        torch.randn(rows, 3, 8, generator=g), torch.randn(rows, 3, generator=g), cache, lay,
        4, 5, 0.7,
    )  # fmt: skip
    bad = idx.clone()
    bad[rows - 1, 1] = experts  # checked before the parallel loop, which cannot raise
    with pytest.raises(IndexError, match="expert id"):
        moe_numba._moe_rows_parallel(
            packed.project(x).numpy(), bad.numpy(), torch.ones(rows, 2).numpy(), packed.down,
            packed.shared_down, packed.limit, x.new_empty(rows, 16).numpy(), 2,
        )  # fmt: skip
    from deepring.kernels.attention_decode_numba import decode_attention_numba

    for mode in ("window", "dense", "topk"):
        decode_attention_numba(*decode_case(g, mode, False, [3, 0, 2, 1, 4]))
    assert sorted(set(row_splits_checked)) == sorted([
        "_hc_merge_rows", "_hc_pre_rows", "_moe_rows_parallel", "_norm_rope_rows",
        "_rms_norm_rows", "_rope_in_place_rows", "_select_rows", "_settle_rows", "_decode_rows",
    ])  # fmt: skip


def test_run_rows_splits_only_where_each_thread_gets_enough_rows(monkeypatch):
    import numba
    import numpy as np

    calls = []
    serial = lambda *a: calls.append(("serial", a[0].shape[0]))  # noqa: E731
    parallel = lambda *a: calls.append(("parallel", a[0].shape[0], a[-1]))  # noqa: E731
    monkeypatch.setattr(dispatch, "parallel_threads", lambda: 2)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)  # already matched: not set
    monkeypatch.setattr(numba, "set_num_threads", lambda n: calls.append(("set", n)))
    for n in (7, 8, 100):
        dispatch.run_rows(serial, parallel, 4, np.zeros(n), 1.0)
    assert calls == [("serial", 7), ("parallel", 8, 2), ("parallel", 100, 2)]
    monkeypatch.setattr(dispatch, "parallel_threads", lambda: 1)  # no OpenMP layer
    dispatch.run_rows(serial, parallel, 4, np.zeros(100), 1.0)
    assert calls[-1] == ("serial", 100)


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch on n threads inside the block; torch's and numba's thread counts put back on
    exit."""
    import numba

    before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        numba.set_num_threads(numba_before)


def test_parallel_threads_follow_numba_openmp_layer_and_torch():
    import numba

    with _torch_threads(2):
        threads = dispatch.parallel_threads()
        assert threads in (1, 2)
        if threads > 1:
            assert numba.threading_layer() == "omp"
    with _torch_threads(1):
        assert dispatch.parallel_threads() == 1


def test_starting_numba_threads_leaves_torch_thread_count_alone():
    """Starting its OpenMP layer, numba sets OpenMP's thread count, which torch reads: the
    probe must put torch's back (a fresh process: the layer starts once). Serving workers run
    torch on one thread each and never start it."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "torch.set_num_threads({n})\n"
        "from deepring.kernels import dispatch\n"
        "p = dispatch.parallel_threads()\n"
        "import numba\n"
        "print(torch.get_num_threads(), p, numba.config.NUMBA_NUM_THREADS)\n"
    )
    env = {**os.environ, "NUMBA_NUM_THREADS": "3"}
    for n in (1, 2):
        out = subprocess.run(
            [sys.executable, "-c", code.format(n=n)], env=env, capture_output=True, text=True,
            check=True, timeout=120,
        ).stdout.split()  # fmt: skip
        assert out[0] == str(n), out
        assert out[2] == "3"
        assert out[1] in (("1",) if n == 1 else ("1", "2"))


def test_model_load_compiles_the_row_parallel_kernels_steps_use():
    """With torch on two threads, load_model also compiles the row-parallel variants, for the
    argument types of a prefill and a decode step big enough to split their rows."""
    from deepring.kernels import (
        attention_decode_numba,
        greedy,
        hyper,
        indexer,
        moe_numba,
        rmsnorm,
        rope,
    )
    from deepring.model.batch import ForwardBatch, SeqChunk
    from deepring.model.loader import load_model
    from v4_helpers import model_config, pool_for, step

    kernels = [
        hyper._hc_pre_rows, hyper._hc_merge_rows, rmsnorm._rms_norm_rows, rope._norm_rope_rows,
        rope._rope_in_place_rows, greedy._settle_rows, moe_numba._moe_rows_parallel,
        indexer._select_rows, attention_decode_numba._decode_rows,
    ]  # fmt: skip
    with _torch_threads(2):
        if dispatch.parallel_threads() < 2:
            pytest.skip("numba has no OpenMP threading layer here: the kernels run serially")
        model = load_model(model_config("swa-csa-hca"), load_format="dummy", device="cpu").model
        compiled = [len(k.signatures) for k in kernels]
        assert all(compiled), compiled
        n = 18  # decode rows: more than the greedy head's plain-GEMM limit, enough to split
        pool = pool_for(model, num_blocks=2 * n + 1, num_slots=n, block_size=16)
        blocks = [[1 + 2 * i, 2 + 2 * i] for i in range(n)]
        step(model, pool, [SeqChunk(list(range(5, 25)), 0, i, blocks[i]) for i in range(n)])
        chunks = [SeqChunk([7 + i], 20, i, blocks[i]) for i in range(n)]
        batch = ForwardBatch.build(chunks, model.rope_tables(), 16, "cpu")
        model(batch, pool, greedy=True)
        assert [len(k.signatures) for k in kernels] == compiled
