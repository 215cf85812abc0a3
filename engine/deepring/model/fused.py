"""Linear layers that read the same input, run as one GEMM.

After fusing, each layer's weight is a view into one concatenated matrix, so parameters keep
their names (checkpoints and state_dict are unchanged) and no memory is duplicated. If a weight
is later replaced (not updated in place), the next call notices and fuses again. Layers kept
quantised (model.linear.Linear: each its own FP8 block grid) are not fused: each runs its own
quantised GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FusedLinears:
    def __init__(self, linears: list[nn.Linear]) -> None:
        self.linears = linears
        self.sizes = [lin.out_features for lin in linears]
        self.weight: torch.Tensor | None = None
        self._ptrs: list[int] = []
        # Whether any layer keeps its weight quantised: settled at load (model.weights lays
        # the layers out before any forward), so read once, off the per-call path.
        self._kept: bool | None = None

    def _fuse(self) -> None:
        with torch.no_grad():
            w = torch.cat([lin.weight.data for lin in self.linears])
            off = 0
            for lin, n in zip(self.linears, self.sizes, strict=True):
                lin.weight.data = w[off : off + n]
                off += n
        self.weight = w
        self._ptrs = [lin.weight.data_ptr() for lin in self.linears]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._kept is None:
            self._kept = any(getattr(lin, "quant", None) is not None for lin in self.linears)
        if self._kept:
            return tuple(lin(x) for lin in self.linears)
        if self.weight is None or any(
            lin.weight.data_ptr() != p for lin, p in zip(self.linears, self._ptrs, strict=True)
        ):
            self._fuse()
        return F.linear(x, self.weight).split(self.sizes, dim=-1)
