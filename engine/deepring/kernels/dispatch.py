"""Choose between the Triton kernel and the torch reference for one call.

DEEPRING_KERNELS=auto (default): CUDA tensors take Triton, CPU tensors the torch reference.
DEEPRING_KERNELS=torch: always the reference. DEEPRING_KERNELS=triton: always Triton, which for
CPU tensors only works under TRITON_INTERPRET=1 (how the tests run the whole model through the
kernels without a GPU).
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
    b = backend()
    if b == "triton":
        return True
    return b == "auto" and x.is_cuda and HAVE_TRITON


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
