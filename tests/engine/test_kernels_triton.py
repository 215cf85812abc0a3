"""Run triton_cases.py: under TRITON_INTERPRET=1 on CPU, and on a CUDA device when present.

A subprocess, because TRITON_INTERPRET must be set before triton is first imported and this
process has imported it already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("triton_cases.py")


def _run(extra_env: dict[str, str]) -> None:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(extra_env)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        cwd=CASES.parents[2],
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout


@pytest.mark.slow
def test_triton_kernels_match_references_in_interpreter():
    _run({"TRITON_INTERPRET": "1"})


@pytest.mark.gpu
def test_triton_kernels_match_references_on_gpu():
    _run({})
