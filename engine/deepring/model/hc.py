"""Manifold-constrained hyper-connections (mHC): hc_mult residual streams per token.

Before each sublayer the streams are RMS-normalised together and projected to three mixes:
`pre` (how the streams collapse into the sublayer input), `post` (how the sublayer output is
spread back) and `comb` (how streams feed each other), the last made doubly stochastic by
Sinkhorn-Knopp iterations. Everything here runs in fp32; the math is in kernels.hyper.
"""

from __future__ import annotations

import torch
from torch import nn

from deepring.kernels.hyper import collapse, hc_merge, hc_pre, rms_mix


class HyperConnection(nn.Module):
    def __init__(self, hc_mult: int, hidden: int, iters: int, hc_eps: float, norm_eps: float):
        super().__init__()
        self.hc, self.iters, self.hc_eps, self.norm_eps = hc_mult, iters, hc_eps, norm_eps
        n = (2 + hc_mult) * hc_mult
        self.fn = nn.Parameter(torch.zeros(n, hc_mult * hidden, dtype=torch.float32))
        self.base = nn.Parameter(torch.zeros(n, dtype=torch.float32))
        self.scale = nn.Parameter(torch.ones(3, dtype=torch.float32))

    def _scale_vector(self) -> torch.Tensor:
        """scale[0] for the pre mixes, scale[1] for post, scale[2] for comb; rebuilt only when
        the parameter changes (tracked by its version counter)."""
        key = (self.scale.data_ptr(), self.scale._version)
        if getattr(self, "_scale_key", None) != key:
            hc, s = self.hc, self.scale.detach()
            self._scale_vec = torch.cat(
                [s[0:1].expand(hc), s[1:2].expand(hc), s[2:3].expand(hc * hc)]
            )
            self._scale_key = key
        return self._scale_vec

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: [T, hc, D]. Returns post [T, hc], comb_t [T, hc, hc] (comb_t[k, j]: stream j into
        stream k) and the collapsed sublayer input [T, D] in h's dtype."""
        return hc_pre(
            h, self.fn, self.base, self._scale_vector(), self.iters, self.hc_eps, self.norm_eps
        )

    @staticmethod
    def merge(
        h: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb_t: torch.Tensor
    ) -> torch.Tensor:
        """New streams: stream k = post_k * out + sum_j comb_t[k, j] * h_j."""
        return hc_merge(h, out, post, comb_t)


class HyperHead(nn.Module):
    """The final collapse of the streams before the output norm."""

    def __init__(self, hc_mult: int, hidden: int, hc_eps: float, norm_eps: float):
        super().__init__()
        self.hc_eps, self.norm_eps = hc_eps, norm_eps
        self.hc_fn = nn.Parameter(torch.zeros(hc_mult, hc_mult * hidden, dtype=torch.float32))
        self.hc_base = nn.Parameter(torch.zeros(hc_mult, dtype=torch.float32))
        self.hc_scale = nn.Parameter(torch.ones(1, dtype=torch.float32))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mix = rms_mix(h, self.hc_fn, self.norm_eps)
        pre = torch.sigmoid(mix * self.hc_scale + self.hc_base) + self.hc_eps
        return collapse(pre, h)
