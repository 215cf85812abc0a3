"""Mixture of experts: routed experts (learned top-k or frozen hash routing) plus shared experts.

Router scores are sqrtsoftplus(logits) (or softmax / sigmoid). Learned routing picks the top-k of
score + e_score_correction_bias (the bias only steers selection); hash routing takes the experts
from the frozen tid2eid[token] table. Either way the weights are the unbiased scores of the
chosen experts, renormalised to sum to one and multiplied by routed_scaling_factor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepring.kernels.dispatch import use_numba
from deepring.kernels.moe import (
    MOE_NUMBA_MAX_BYTES,
    MOE_NUMBA_ROWS,
    MoEPacked,
    clamped_swiglu,
    moe_experts,
    moe_rows_numba,
    route_numba,
)
from deepring.model.config import HASH_MOE, ModelConfig
from deepring.model.fused import FusedLinears
from deepring.model.norm import linear


def _score(logits: torch.Tensor, func: str) -> torch.Tensor:
    if func == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    if func == "softmax":
        return torch.softmax(logits, -1, dtype=torch.float32).to(logits.dtype)
    return torch.sigmoid(logits)


class Router(nn.Module):
    def __init__(self, config: ModelConfig, hashed: bool) -> None:
        super().__init__()
        self.hashed = hashed
        self.top_k = config.num_experts_per_tok
        self.func = config.scoring_func
        self.scaling = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(config.n_routed_experts, config.hidden_size))
        if hashed:
            self.register_buffer(
                "tid2eid", torch.zeros(config.vocab_size, self.top_k, dtype=torch.long)
            )
        else:
            self.register_buffer(
                "e_score_correction_bias", torch.zeros(config.n_routed_experts, dtype=torch.float32)
            )

    def forward(
        self, x: torch.Tensor, input_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.route(F.linear(x, self.weight), input_ids)

    def route(
        self, logits: torch.Tensor, input_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ids and weights [T, k] from the router logits [T, E]."""
        if use_numba(logits) and logits.shape[0]:
            bias = None if self.hashed else self.e_score_correction_bias
            hashed_idx = self.tid2eid[input_ids] if self.hashed else None
            return route_numba(logits, self.func, bias, hashed_idx, self.top_k, self.scaling)
        scores = _score(logits, self.func)
        if self.hashed:
            idx = self.tid2eid[input_ids].long()
        else:
            idx = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1).indices
        w = scores.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.scaling


class Experts(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, d, i = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        self.limit = config.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, d))
        self.down_proj = nn.Parameter(torch.zeros(e, d, i))

    def forward(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return moe_experts(x, idx, w, self.gate_up_proj, self.down_proj, self.limit)


class SharedMLP(nn.Module):
    """Clamped SwiGLU, the same activation as the routed experts."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, i = config.hidden_size, config.moe_intermediate_size * config.n_shared_experts
        self.limit = config.swiglu_limit
        self.gate_proj = linear(d, i)
        self.up_proj = linear(d, i)
        self.down_proj = linear(i, d)
        self._gate_up = FusedLinears([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self._gate_up(x)
        return self.down_proj(clamped_swiglu(g, u, self.limit))


class MoE(nn.Module):
    def __init__(self, config: ModelConfig, mlp_type: str) -> None:
        super().__init__()
        self.gate = Router(config, hashed=mlp_type == HASH_MOE)
        self.experts = Experts(config)
        self.shared_experts = SharedMLP(config)
        self._packed = MoEPacked()

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        if use_numba(x, MOE_NUMBA_ROWS) and self._numba_fits():
            ex, sh = self.experts, self.shared_experts
            packed = self._packed.prepare(
                ex.gate_up_proj, ex.down_proj, sh.gate_proj.weight, sh.up_proj.weight,
                sh.down_proj.weight, ex.limit, self.gate.weight,
            )  # fmt: skip
            h = packed.project(x)  # every expert's gate / up, the shared one's, the router's
            idx, w = self.gate.route(h[:, packed.router_at :], input_ids)
            return moe_rows_numba(h, idx, w, packed)
        idx, w = self.gate(x, input_ids)
        return self.experts(x, idx, w) + self.shared_experts(x)

    def _numba_fits(self) -> bool:
        """The numba MoE copies the gate / up projections: only for small layers, in inference."""
        w = self.experts.gate_up_proj
        return not w.requires_grad and w.numel() * w.element_size() <= MOE_NUMBA_MAX_BYTES
