"""Triton's interpreter (TRITON_INTERPRET=1, set before triton is first imported) for the files
that run Triton kernels on CPU tensors in a subprocess (triton_cases.py, quant_model_cases.py):
`run_cases` starts that subprocess, `patch_interpreter` sets the interpreter up inside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_cases(cases: Path, extra_env: dict[str, str]) -> None:
    """Run the pytest file `cases` in a fresh interpreter with `extra_env` (TRITON_INTERPRET=1
    for the interpreter, nothing for a CUDA device); it must pass."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(extra_env)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        cwd=cases.parents[2],
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout


def patch_interpreter() -> None:
    """Triton 3.6's interpreter turns scalar kernel arguments into 1-element arrays and indexes
    loops with int(array), which NumPy >= 2.3 refuses for non-0-d arrays. Shim __index__ so
    `range(0, n, BLOCK)` over a runtime n works; kernels and their semantics are untouched."""
    import triton.runtime.interpreter as _interp

    _patch_tensor = _interp._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        _patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interp._patch_lang_tensor = _patch_lang_tensor


def interpreter_or_skip() -> bool:
    """At the top of a cases file, before triton is imported: skip the module without the
    interpreter or a CUDA device, set the interpreter up when it is on; True when it is."""
    import torch

    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpret and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 or a CUDA device", allow_module_level=True)
    if interpret:
        patch_interpreter()
    return interpret
