"""RMSNorm module (fp32 weight, like the checkpoint) over the rmsnorm kernel."""

from __future__ import annotations

import torch
from torch import nn

from deepring.kernels.rmsnorm import rms_norm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
