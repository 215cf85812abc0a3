"""Every DEEPRING_* environment variable the engine reads, in one place.

Each variable is read when it is needed (not at import), parsed strictly, and a bad value raises
ValueError naming the variable, so a typo fails loudly instead of silently falling back.

Variables read elsewhere, listed here so this file stays the index:
- DEEPRING_TOKENIZER_THREADS: prompt-encoding threads, read by deepring_recipe (Rust).
- DEEPRING_TEST_TOKENIZER: the tokenizer fixture path, read by the test suites and ./dev.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

KERNEL_BACKENDS = ("auto", "torch", "numba", "triton")
GREEDY_HEADS = ("auto", "int8", "int8-fbgemm", "int8-avx2", "bf16", "fp16", "fp32")


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


def _choice(name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (case-insensitive); the first when the variable is unset."""
    value = _raw(name)
    if value is None:
        return choices[0]
    value = value.lower()
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def v41_keep() -> int:
    """DEEPRING_V41_KEEP: DeepSeek V4.1's decoder SWA bounded replay, the prompt tokens (the
    last ones) the decoder layers compute at prefill (default 140, DeepInfer's V4.1 setting;
    0: every token). Must be >= the sliding window + the ring's backtrack slots."""
    value = _raw("DEEPRING_V41_KEEP")
    if value is None:
        return 140
    try:
        keep = int(value)
    except ValueError:
        raise ValueError(f"DEEPRING_V41_KEEP must be an integer, got {value!r}") from None
    if keep < 0:
        raise ValueError(f"DEEPRING_V41_KEEP must be >= 0, got {keep}")
    return keep


def v41_kv_cache() -> str:
    """DEEPRING_V41_KV_CACHE: how DeepSeek V4.1's main KV and indexer keys are stored: plain
    (the cache dtype, the default) | fp4 (E2M1 with E4M3 scales per 16 / E8M0 per 32)."""
    return _choice("DEEPRING_V41_KV_CACHE", ("plain", "fp4"))


def kernel_backend() -> str:
    """DEEPRING_KERNELS: auto (Triton on CUDA tensors, numba or torch on CPU) | torch | numba |
    triton (see kernels.dispatch)."""
    return _choice("DEEPRING_KERNELS", KERNEL_BACKENDS)


def greedy_head() -> str:
    """DEEPRING_GREEDY_HEAD: the exact greedy LM head of fp32 CPU decoding (kernels.greedy_head):
    auto (the available heads timed on the model's head, the fastest per batch size:
    kernels.greedy_choice) | int8 | int8-fbgemm | int8-avx2 | bf16 | fp16 | fp32. Every head
    gives the fp32 argmax."""
    return _choice("DEEPRING_GREEDY_HEAD", GREEDY_HEADS)


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


def _positive_float(name: str, default: float) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}") from None
    if not x > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return x


def heartbeat_interval() -> float:
    """DEEPRING_HEARTBEAT_INTERVAL: seconds between heartbeats on the rings (default 1)."""
    return _positive_float("DEEPRING_HEARTBEAT_INTERVAL", 1.0)


def heartbeat_timeout() -> float:
    """DEEPRING_HEARTBEAT_TIMEOUT: seconds of silence after which a peer is declared dead
    (default 10). Local child processes are noticed at once through their exit instead."""
    return _positive_float("DEEPRING_HEARTBEAT_TIMEOUT", 10.0)


def crash_loop() -> tuple[int, float]:
    """DEEPRING_CRASH_LOOP_EXITS / DEEPRING_CRASH_LOOP_WINDOW: a worker that exits this many
    times (default 5) within this many seconds (default 300) is reported as crash-looping."""
    return int(_positive_float("DEEPRING_CRASH_LOOP_EXITS", 5)), _positive_float(
        "DEEPRING_CRASH_LOOP_WINDOW", 300.0
    )


def drain_timeout() -> float:
    """DEEPRING_DRAIN_TIMEOUT: seconds SIGTERM waits for in-flight requests (default 30)."""
    return _positive_float("DEEPRING_DRAIN_TIMEOUT", 30.0)


def ipc_dir() -> Path:
    """DEEPRING_IPC_DIR: where `deepring serve` creates its ipc:// socket files (default: the
    system temporary directory). Keep it short: socket paths are limited to ~100 bytes."""
    value = _raw("DEEPRING_IPC_DIR")
    return Path(value).expanduser() if value else Path(tempfile.gettempdir())


def api_key() -> str | None:
    """DEEPRING_API_KEY: one API key the frontend accepts, besides --api-key and
    --api-keys-file (default: none). Its value is never echoed in an error."""
    return _raw("DEEPRING_API_KEY")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level() -> str:
    """DEEPRING_LOG_LEVEL: DEBUG | INFO | WARNING | ERROR for every serving process (default
    INFO)."""
    value = _raw("DEEPRING_LOG_LEVEL")
    if value is None:
        return "INFO"
    value = value.upper()
    if value not in LOG_LEVELS:
        raise ValueError(f"DEEPRING_LOG_LEVEL must be one of {LOG_LEVELS}, got {value!r}")
    return value
