"""Set up Triton's interpreter (TRITON_INTERPRET=1, set before triton is first imported) for
the files that run Triton kernels on CPU tensors in a subprocess (triton_cases.py,
quant_model_cases.py)."""

from __future__ import annotations


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
