"""Choose between the Triton kernel and the torch reference for one call.

CPU tensors always take the torch reference (Triton has no CPU backend; the interpreter is for
tests). CUDA tensors take Triton unless DEEPRING_KERNELS=torch.
"""

from __future__ import annotations

import torch

from deepring import env

try:
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # triton is only installed on Linux x86_64
    HAVE_TRITON = False

_backend: str | None = None


def backend() -> str:
    global _backend
    if _backend is None:
        _backend = env.kernel_backend()
        if _backend == "triton" and not HAVE_TRITON:
            raise ValueError("DEEPRING_KERNELS=triton but triton is not installed")
    return _backend


def reset() -> None:
    """Forget the cached backend choice (tests that change DEEPRING_KERNELS call this)."""
    global _backend
    _backend = None


def use_triton(x: torch.Tensor) -> bool:
    if not x.is_cuda:
        return False
    return backend() != "torch" and HAVE_TRITON


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
