"""Choose between the Triton kernel and the torch reference for one call.

DEEPRING_KERNELS=auto (default): CUDA tensors take Triton; fp32 CPU tensors take an op's numba
kernel where it has one, else the torch reference. DEEPRING_KERNELS=torch: always the reference.
DEEPRING_KERNELS=numba: the numba kernels for CPU tensors of any size. DEEPRING_KERNELS=triton:
always Triton, which for CPU tensors only works under TRITON_INTERPRET=1 (how the tests run the
whole model through the kernels without a GPU).

Why numba on CPU: a small model's decode step is about a thousand torch ops of a few
microseconds of work each, and each costs 10-40 us in dispatch and cold caches. A numba kernel
does one op's whole chain of elementwise work in one call, compiled for this CPU. GEMMs stay
with torch (oneDNN / MKL).

Kernels whose rows are independent also have a row-parallel variant (cpu_parallel_kernel),
which run_rows calls with the rows shared out among threads. numba's OpenMP layer binds to the
OpenMP runtime torch loaded (torch puts it in the global symbol scope), so both use one pool of
threads: a parallel loop starts on the threads that wait, spinning, between torch's ops.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import numpy as np
import torch

from deepring import env

try:
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # triton is only installed on Linux x86_64
    HAVE_TRITON = False

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # an optional speed-up: the torch reference runs without it
    HAVE_NUMBA = False

# The loop of a row-parallel kernel (cpu_parallel_kernel); a plain range without numba.
prange = numba.prange if HAVE_NUMBA else range

# Reassociation lets numba vectorise reductions; no "nnan"/"ninf": masks use -inf.
_FASTMATH = {"reassoc", "contract", "arcp", "nsz"}

_backend: str | None = None


def backend() -> str:
    global _backend
    if _backend is None:
        _backend = env.kernel_backend()
        if _backend == "triton" and not HAVE_TRITON:
            raise ValueError("DEEPRING_KERNELS=triton but triton is not installed")
        if _backend == "numba" and not HAVE_NUMBA:
            raise ValueError("DEEPRING_KERNELS=numba but numba is not installed")
    return _backend


def reset() -> None:
    """Forget the cached backend choice (tests that change DEEPRING_KERNELS call this)."""
    global _backend
    _backend = None


def triton_runs_on(device: torch.device) -> bool:
    """Whether Triton kernels can run on `device`'s tensors: CUDA ones, or any under Triton's
    interpreter (TRITON_INTERPRET=1, Triton's own variable, which takes effect when triton is
    first imported: the tests set it in a fresh process)."""
    return HAVE_TRITON and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def use_triton(x: torch.Tensor) -> bool:
    b = backend()
    if b == "triton":
        return True
    return b == "auto" and x.is_cuda and HAVE_TRITON


def use_numba(x: torch.Tensor, max_rows: int | None = None) -> bool:
    """Whether an op with a numba kernel runs it for x: fp32 CPU tensors without autograd;
    under `auto` only up to `max_rows` rows, where an op's torch path (multi-threaded GEMMs)
    wins beyond that."""
    b = backend()
    if b not in ("auto", "numba") or not HAVE_NUMBA:
        return False
    if b == "auto" and max_rows is not None and x.shape[0] > max_rows:
        return False
    return x.device.type == "cpu" and x.dtype == torch.float32 and not x.requires_grad


def use_numba_plan(x: torch.Tensor) -> bool:
    """Whether integer bookkeeping (a step's masks and row indices) runs its numba kernel for x:
    any CPU tensor, under `auto` or `numba`."""
    b = backend()
    return b in ("auto", "numba") and HAVE_NUMBA and x.device.type == "cpu"


def cpu_kernel(fn):
    """A numba CPU kernel: compiled on first call for the argument types it gets, and cached
    on disk (numba's cache) so later processes load it instead of compiling again. Without
    numba the plain function is returned; use_numba keeps it from being called."""
    if not HAVE_NUMBA:
        return fn
    return numba.njit(cache=True, fastmath=_FASTMATH, nogil=True, error_model="numpy")(fn)


def cpu_parallel_kernel(fn):
    """A numba kernel whose `prange` loop is shared out among threads (numba's parallel=True):
    the row-parallel wrappers that run_rows calls with the rows cut into `parts` ranges."""
    if not HAVE_NUMBA:
        return fn
    return numba.njit(
        cache=True, fastmath=_FASTMATH, nogil=True, error_model="numpy", parallel=True
    )(fn)


@cpu_parallel_kernel
def _probe(x):
    for i in prange(x.shape[0]):
        x[i] = i


@functools.cache
def _numba_openmp() -> bool:
    """Whether numba's threading layer is OpenMP. Starting a parallel loop on OpenMP's waiting
    threads costs about a microsecond; numba's fallback layer (workqueue, where no OpenMP
    runtime is installed) took about 50 us (ad-hoc, 2-core dev machine), more than the kernels
    split here take, and may not be entered from two threads at once."""
    if not HAVE_NUMBA:
        return False
    if numba.config.THREADING_LAYER == "default":  # numba's own order tries TBB first
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]
    torch_threads = torch.get_num_threads()
    try:
        numba.set_num_threads(min(numba.config.NUMBA_NUM_THREADS, torch_threads))
        _probe(np.zeros(2))
    except (ValueError, RuntimeError, OSError, ImportError):  # no threading layer loads
        return False
    finally:
        # Starting its OpenMP layer, numba sets OpenMP's thread count to NUMBA_NUM_THREADS,
        # and torch reads its own from there: put torch's back.
        torch.set_num_threads(torch_threads)
    return numba.threading_layer() == "omp"


def parallel_threads() -> int:
    """How many threads the row-parallel kernels use now: torch's, where numba's threading
    layer is OpenMP and numba may start that many; else 1, and run_rows calls the serial
    kernels."""
    threads = torch.get_num_threads()
    if threads < 2 or not HAVE_NUMBA or threads > numba.config.NUMBA_NUM_THREADS:
        return 1
    return threads if _numba_openmp() else 1


def serial_rows_limit(rows: int) -> int | None:
    """A use_numba row limit that only holds for serial kernels (beyond it torch's threads
    win): None, no limit, where the kernel's rows are shared out among threads (run_rows)."""
    return None if parallel_threads() > 1 else rows


def run_rows(serial: Callable, parallel: Callable, min_rows: int, *args) -> None:
    """serial(*args), a kernel whose rows (the first axis of args[0]) are independent, or
    parallel(*args, parts) with the rows cut into `parts` ranges, one per thread, each of at
    least min_rows rows (below that, starting threads costs more than it saves)."""
    threads = parallel_threads()
    parts = min(threads, args[0].shape[0] // min_rows)
    if parts > 1:
        # The launch's team is numba's thread count (kept per calling thread): torch's.
        if numba.get_num_threads() != threads:
            numba.set_num_threads(threads)
        parallel(*args, parts)
    else:
        serial(*args)


def weight_array(w: torch.Tensor):
    """An fp32 numpy view of a weight for the numba kernels, made once and kept on the tensor
    (a decode step passes each weight to a kernel every layer, and the conversion is a few ops
    each time); made again when the weight is updated in place or replaced."""
    if w.is_inference():  # no version counter to tell an update by: converted each time
        return w.detach().float().contiguous().numpy()
    key = (w.data_ptr(), w._version)
    held = getattr(w, "_deepring_array", None)
    if held is not None and held[0] == key:
        return held[1]
    arr = w.detach().float().contiguous().numpy()
    w._deepring_array = (key, arr)
    return arr


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
