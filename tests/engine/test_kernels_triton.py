"""Run triton_cases.py: under TRITON_INTERPRET=1 on CPU, and on a CUDA device when present.

A subprocess, because TRITON_INTERPRET must be set before triton is first imported and this
process has imported it already.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from triton_interp import run_cases

CASES = Path(__file__).with_name("triton_cases.py")


def _run(extra_env: dict[str, str]) -> None:
    run_cases(CASES, extra_env)


@pytest.mark.slow
def test_triton_kernels_match_references_in_interpreter():
    _run({"TRITON_INTERPRET": "1"})


@pytest.mark.gpu
def test_triton_kernels_match_references_on_gpu():
    _run({})
