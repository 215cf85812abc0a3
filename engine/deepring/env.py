"""Every DEEPRING_* environment variable the engine reads, in one place.

Each variable is read when it is needed (not at import), parsed strictly, and a bad value raises
ValueError naming the variable, so a typo fails loudly instead of silently falling back.

Variables read elsewhere, listed here so this file stays the index:
- DEEPRING_TOKENIZER_THREADS: prompt-encoding threads, read by deepring_recipe (Rust).
- DEEPRING_TEST_TOKENIZER: the tokenizer fixture path, read by the test suites and ./dev.
"""

from __future__ import annotations

import os
from pathlib import Path

KERNEL_BACKENDS = ("auto", "torch", "triton")


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def cache_dir() -> Path:
    """DEEPRING_CACHE_DIR: where embedded model weights are cached (default ~/.cache/deepring)."""
    value = _raw("DEEPRING_CACHE_DIR")
    if value is None:
        base = _raw("XDG_CACHE_HOME")
        return (Path(base) if base else Path.home() / ".cache") / "deepring"
    return Path(value).expanduser()


def kernel_backend() -> str:
    """DEEPRING_KERNELS: auto (Triton on CUDA tensors, torch otherwise) | torch | triton."""
    value = _raw("DEEPRING_KERNELS")
    if value is None:
        return "auto"
    value = value.lower()
    if value not in KERNEL_BACKENDS:
        raise ValueError(f"DEEPRING_KERNELS must be one of {KERNEL_BACKENDS}, got {value!r}")
    return value


def cpu_threads() -> int | None:
    """DEEPRING_CPU_THREADS: torch intra-op threads for CPU inference (default: torch's choice)."""
    value = _raw("DEEPRING_CPU_THREADS")
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise ValueError(
            f"DEEPRING_CPU_THREADS must be a positive integer, got {value!r}"
        ) from None
    if n < 1:
        raise ValueError(f"DEEPRING_CPU_THREADS must be a positive integer, got {value!r}")
    return n
