"""V4 attention: low-rank Q, one shared K=V head with partial RoPE, per-head sinks, a sliding
window branch on every layer plus compressed entries (CSA top-k or all HCA entries), inverse RoPE
on the output and a grouped low-rank output projection."""

from __future__ import annotations

import torch
from torch import nn

from deepring.cache.pool import LayerCache
from deepring.kernels.attention import AttentionParams, window_attention
from deepring.kernels.rope import apply_rope, norm_rope
from deepring.model.batch import ForwardBatch
from deepring.model.compressor import Compressor
from deepring.model.config import CSA, SLIDING, ModelConfig
from deepring.model.fused import FusedLinears
from deepring.model.linear import grouped_linear, linear
from deepring.model.norm import RMSNorm


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_type: str) -> None:
        super().__init__()
        d, h, hd = config.hidden_size, config.num_attention_heads, config.head_dim
        self.heads, self.head_dim, self.groups = h, hd, config.o_groups
        self.window = config.sliding_window
        self.eps = config.rms_norm_eps
        self.rope_kind = "main" if layer_type == SLIDING else "compress"
        self.ratio = config.compress_rate(layer_type)
        self.q_a_proj = linear(d, config.q_lora_rank)
        self.q_a_norm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_b_proj = linear(config.q_lora_rank, h * hd)
        self.kv_proj = linear(d, hd)
        self.kv_norm = RMSNorm(hd, config.rms_norm_eps)
        # Grouped output projection: weight [groups * o_lora, h * hd / groups], one block per group.
        self.o_a_proj = linear(h * hd // config.o_groups, config.o_groups * config.o_lora_rank)
        self.o_b_proj = linear(config.o_groups * config.o_lora_rank, d)
        self.sinks = nn.Parameter(torch.zeros(h, dtype=torch.float32))
        self.scale = hd**-0.5
        self.compressor = (
            None if layer_type == SLIDING else Compressor(config, self.ratio, layer_type == CSA)
        )
        # Every projection of the layer input runs as one GEMM.
        extra = self.compressor.projections() if self.compressor is not None else []
        self._in_proj = FusedLinears([self.q_a_proj, self.kv_proj, *extra])
        # Likewise every projection of q_lora (the indexer's query on CSA layers).
        extra_q = self.compressor.query_projections() if self.compressor is not None else []
        self._q_proj = FusedLinears([self.q_b_proj, *extra_q])

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache) -> torch.Tensor:
        t = x.shape[0]
        cos, sin = batch.cos_sin(self.rope_kind)
        proj = self._in_proj(x)
        q_lora = self.q_a_norm(proj[0])
        kind = self.rope_kind
        q_proj = self._q_proj(q_lora)
        q = q_proj[0].view(t, self.heads, self.head_dim)
        q = norm_rope(q, None, self.eps, cos, sin, batch.rope_cis(kind, False, 3))
        kv_cis = batch.rope_cis(kind, False, 2)
        kv = norm_rope(proj[1], self.kv_norm.weight, self.kv_norm.eps, cos, sin, kv_cis)

        comp_idx = None
        if self.compressor is not None:
            comp_idx = self.compressor(proj[2:], q_proj[1:], batch, cache)
        params = AttentionParams(self.ratio, self.sinks, self.scale, self.window)
        out = window_attention(q, kv, cache, comp_idx, params, batch)

        out = apply_rope(out, cos, sin, True, inplace=True, cis=batch.rope_cis(kind, True, 3))
        mixed = grouped_linear(out.reshape(t, self.groups, -1), self.o_a_proj)
        return self.o_b_proj(mixed.reshape(t, -1))
