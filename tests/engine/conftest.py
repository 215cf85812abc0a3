"""Engine test settings."""

import pytest
import torch
from deepring.kernels import greedy as greedy_kernels
from deepring.kernels import greedy_head, greedy_int8, greedy_masked
from deepring.kernels.dispatch import HAVE_NUMBA

# One intra-op thread: the test models are tiny (overhead-bound), and a second OpenMP thread
# costs 10x when the cores are shared with another job (a Rust build, another test run).
torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def flush_denormals():
    """Denormals flushed while an engine test module runs, as the engine's CPU path does, and
    restored after: the setting is process-wide, and hypothesis refuses to draw floats under it."""
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session", autouse=True)
def deepring_cache_dir(tmp_path_factory):
    """Embedded models are created in a per-session directory, never in the user's cache."""
    mp = pytest.MonkeyPatch()
    d = tmp_path_factory.mktemp("deepring-cache")
    mp.setenv("DEEPRING_CACHE_DIR", str(d))
    yield d
    mp.undo()


ROW_PARALLEL_MODULES = (
    "attention_decode_numba", "greedy", "hyper", "indexer", "moe_numba", "rmsnorm", "rope",
)  # fmt: skip


@pytest.fixture
def row_splits_checked(monkeypatch):
    """Every kernels.dispatch.run_rows call made in the test also runs the kernel's row-parallel
    variant on copies of its arguments, the rows cut into 2, 3 and more ranges than rows (empty
    ranges), on two threads where numba has them, and checks that each writes exactly what the
    serial kernel writes. (The engine tests keep torch, and so run_rows, on one thread: without
    this the parallel variants would not run here.) Returns the list of checked kernels."""
    import importlib

    import numba
    import numpy as np
    from deepring.kernels import dispatch

    real = dispatch.run_rows
    checked = []

    def checking(serial, parallel, min_rows, *args):
        def copies():
            return [np.copy(a) if isinstance(a, np.ndarray) else a for a in args]

        want = copies()
        serial(*want)
        # Starting numba's threading layer sets OpenMP's (so torch's) thread count: both are
        # put back (torch's read first).
        torch_threads = torch.get_num_threads()
        threads = numba.get_num_threads()
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        try:
            for parts in (2, 3, args[0].shape[0] + 1):
                got = copies()
                parallel(*got, parts)
                for a, b in zip(got, want, strict=True):
                    if isinstance(a, np.ndarray):
                        np.testing.assert_array_equal(a, b, err_msg=parallel.__name__)
        finally:
            numba.set_num_threads(threads)
            torch.set_num_threads(torch_threads)
        checked.append(parallel.__name__)
        real(serial, parallel, min_rows, *args)

    for name in ROW_PARALLEL_MODULES:
        module = importlib.import_module(f"deepring.kernels.{name}")
        monkeypatch.setattr(module, "run_rows", checking)
    return checked


_NO_INT8 = pytest.mark.skipif(
    not hasattr(torch.ops.onednn, "qlinear_prepack"), reason="no oneDNN int8 linear in this torch"
)
_NO_NUMBA = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")
# fbgemm's heads run on any x86 CPU (AVX2 is enough): only a torch without fbgemm skips them.
_NO_FBGEMM_INT8 = pytest.mark.skipif(
    not greedy_head.cpu_int8_fbgemm(), reason="no fbgemm int8 linear in this torch"
)
_NO_FP16 = pytest.mark.skipif(not greedy_head.cpu_fp16_gemm(), reason="no fbgemm fp16 GEMM")
# Our AVX2 int8 head (crates/kernels): on an x86 CPU without AVX2 (or another arch) it is absent.
_NO_INT8_AVX2 = pytest.mark.skipif(
    not greedy_int8.cpu_int8_avx2(), reason="no AVX2 for the int8-avx2 head's kernel"
)


@pytest.fixture(
    params=[
        pytest.param(("bf16", "torch"), id="bf16-torch"),
        pytest.param(("bf16", "numba"), id="bf16-numba", marks=_NO_NUMBA),
        pytest.param(("int8", "torch"), id="int8-torch", marks=_NO_INT8),
        pytest.param(("int8", "numba"), id="int8-numba", marks=[_NO_INT8, _NO_NUMBA]),
        pytest.param(("int8-fbgemm", "torch"), id="int8-fbgemm-torch", marks=_NO_FBGEMM_INT8),
        pytest.param(
            ("int8-fbgemm", "numba"), id="int8-fbgemm-numba", marks=[_NO_FBGEMM_INT8, _NO_NUMBA]
        ),
        pytest.param(("fp16", "torch"), id="fp16-torch", marks=_NO_FP16),
        pytest.param(("fp16", "numba"), id="fp16-numba", marks=[_NO_FP16, _NO_NUMBA]),
        # (its candidates' settle and the masked settle of its approximate logits either way)
        pytest.param(("int8-avx2", "torch"), id="int8-avx2-torch", marks=_NO_INT8_AVX2),
        pytest.param(
            ("int8-avx2", "numba"), id="int8-avx2-numba", marks=[_NO_INT8_AVX2, _NO_NUMBA]
        ),
    ]
)
def kind(request, monkeypatch) -> str:
    """The greedy head's low-precision GEMM (kernels.greedy_head), with the torch or numba int8
    quantisation and settling passes (kernels.greedy, kernels.greedy_masked)."""
    kind, impl = request.param
    monkeypatch.setattr(greedy_head, "settle", getattr(greedy_kernels, f"settle_{impl}"))
    quantize = getattr(greedy_kernels, f"quantize_rows_{impl}")
    monkeypatch.setattr(greedy_head, "quantize_rows", quantize)
    # The masked settle (grammar-constrained rows): its numba kernel or the torch path.
    monkeypatch.setattr(greedy_masked, "use_numba", lambda *_: impl == "numba")
    monkeypatch.setattr(greedy_masked, "settle", getattr(greedy_kernels, f"settle_{impl}"))
    # int8-avx2's settle of its candidates: its numba kernel or torch ops.
    monkeypatch.setattr(greedy_int8, "use_numba", lambda *_: impl == "numba")
    return kind
