"""The machine a benchmark ran on, in one line: CPU model, cores, the ISA extensions that decide
which kernels are fast (AVX2 / FMA, AVX-512, VNNI, AMX), and the Python and torch versions.
Every bench script prints it, so each published number names the CPU it came from."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# /proc/cpuinfo flag -> the name the README and the bench output use.
_ISA = {
    "avx2": "AVX2",
    "fma": "FMA",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX512-BF16",
    "amx_tile": "AMX",
}


def _cpuinfo() -> tuple[str, set[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux
        return platform.processor() or platform.machine(), set()
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model or platform.machine(), flags


def isa() -> set[str]:
    """The README names of the ISA extensions this CPU has (the keys' values of _ISA)."""
    return {name for flag, name in _ISA.items() if flag in _cpuinfo()[1]}


def describe() -> str:
    model, flags = _cpuinfo()
    isa = [name for flag, name in _ISA.items() if flag in flags] or ["no AVX2"]
    try:
        import torch

        torch_version = f", torch {torch.__version__}"
    except ImportError:
        torch_version = ""
    return (
        f"machine: {model}, {os.cpu_count()} CPUs, ISA {' '.join(isa)}; "
        f"Python {platform.python_version()}{torch_version}"
    )
