"""Mixture of experts: routed experts (learned top-k or frozen hash routing) plus shared experts.

The parameters live here, under transformers' names; the computation (routing, the experts,
the backend for the device) is kernels.moe's `moe_layer`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from deepring.kernels.moe import MoEPacked, MoEWeights, clamped_swiglu, moe_layer
from deepring.model.config import HASH_MOE, ModelConfig
from deepring.model.fused import FusedLinears
from deepring.model.linear import linear
from deepring.model.quant import MXFP4_GROUP


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


class Experts(nn.Module):
    QUANT_FORMATS = ("mxfp4",)  # what keep_quantised can hold (kernels.moe.moe_experts_mxfp4)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, d, i = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        self.limit = config.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, d))
        self.down_proj = nn.Parameter(torch.zeros(e, d, i))
        self.quant: tuple[str, int] | None = None  # ("mxfp4", 32) once kept quantised

    def keep_quantised(self, fmt: str, block: int) -> None:
        """Swap the experts for MXFP4 uint8 buffers (packed E2M1 pairs and UE8M0 scales, one
        per 32 inputs), on the weights' device (meta before loading: nothing is allocated).
        The checkpoint's per-expert w1 / w3 / w2 stack into them (model.weights)."""
        if fmt != "mxfp4":
            raise ValueError(f"routed experts keep only MXFP4 weights, not {fmt!r}")
        for leaf, scale_leaf in (("gate_up_proj", "gate_up_scale"), ("down_proj", "down_scale")):
            e, out, inp = getattr(self, leaf).shape
            if inp % MXFP4_GROUP:
                raise ValueError(f"MXFP4 experts need inputs % {MXFP4_GROUP} == 0, got {inp}")
            dev = getattr(self, leaf).device
            delattr(self, leaf)
            packed = torch.empty(e, out, inp // 2, dtype=torch.uint8, device=dev)
            self.register_buffer(leaf, packed)
            scale = torch.empty(e, out, inp // MXFP4_GROUP, dtype=torch.uint8, device=dev)
            self.register_buffer(scale_leaf, scale)
        self.quant = ("mxfp4", MXFP4_GROUP)

    def slot_tensors(self) -> dict[str, torch.Tensor]:
        """The per-expert tensors ([E, ...] each) by attribute name: gate_up and down, and for
        experts kept in MXFP4 (packed bytes in those two) their scales, which must move with
        their rows (an expert-parallel rank's shard and rearrangement, a rank's load)."""
        names = ["gate_up_proj", "down_proj"]
        if self.quant is not None:
            names += ["gate_up_scale", "down_scale"]
        return {n: getattr(self, n).data for n in names}

    def keep_slots(self, experts: Sequence[int]) -> None:
        """Keep only `experts`' rows, in that order, of every per-expert tensor (a rank's
        slots; on the meta device only the shapes change and nothing is allocated)."""
        rows = torch.tensor(experts, dtype=torch.long)
        cuts = {}
        for name, t in self.slot_tensors().items():
            if t.device.type == "meta":
                cuts[name] = torch.empty(len(experts), *t.shape[1:], dtype=t.dtype, device=t.device)
            else:
                cuts[name] = t.index_select(0, rows.to(t.device))
        self.set_slot_tensors(cuts)

    def set_slot_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Replace per-expert tensors (slot_tensors' names): parameters stay frozen
        parameters, buffers (kept MXFP4 bytes and scales) stay buffers."""
        for name, t in tensors.items():
            if name in self._parameters:
                setattr(self, name, nn.Parameter(t, requires_grad=False))
            else:
                setattr(self, name, t)


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
        # Expert parallel (deepring.ep.moe.ExpertParallelMoE): `experts` then holds this rank's
        # slots only, and the layer's tokens go to the ranks holding their experts and back.
        self.ep = None

    def weights(self) -> MoEWeights:
        g, ex, sh = self.gate, self.experts, self.shared_experts
        return MoEWeights(
            router=g.weight,
            bias=None if g.hashed else g.e_score_correction_bias,
            tid2eid=g.tid2eid if g.hashed else None,
            func=g.func,
            top_k=g.top_k,
            scaling=g.scaling,
            gate_up=ex.gate_up_proj,
            down=ex.down_proj,
            limit=ex.limit,
            shared_gate=sh.gate_proj.weight,
            shared_up=sh.up_proj.weight,
            shared_down=sh.down_proj.weight,
            gate_up_scale=ex.gate_up_scale if ex.quant is not None else None,
            down_scale=ex.down_scale if ex.quant is not None else None,
        )

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        if self.ep is not None:
            return self.ep(x, input_ids, self.weights(), self.shared_experts)
        return moe_layer(x, input_ids, self.weights(), self._packed, self.shared_experts)
