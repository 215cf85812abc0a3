"""One decoder block: attention and MoE, each wrapped in a hyper-connection."""

from __future__ import annotations

import torch
from torch import nn

from deepring.cache.pool import LayerCache
from deepring.model.attention import Attention
from deepring.model.batch import ForwardBatch
from deepring.model.config import ModelConfig
from deepring.model.hc import HyperConnection
from deepring.model.moe import MoE
from deepring.model.norm import RMSNorm


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_type: str, mlp_type: str) -> None:
        super().__init__()
        hc = (config.hc_mult, config.hidden_size, config.hc_sinkhorn_iters)
        eps = (config.hc_eps, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_type)
        self.mlp = MoE(config, mlp_type)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn_hc = HyperConnection(*hc, *eps)
        self.ffn_hc = HyperConnection(*hc, *eps)

    def forward(
        self, h: torch.Tensor, input_ids: torch.Tensor, batch: ForwardBatch, cache: LayerCache
    ) -> torch.Tensor:
        post, comb, x = self.attn_hc(h)
        a = self.self_attn(self.input_layernorm(x), batch, cache)
        h = HyperConnection.merge(h, a, post, comb)
        post, comb, x = self.ffn_hc(h)
        m = self.mlp(self.post_attention_layernorm(x), input_ids)
        return HyperConnection.merge(h, m, post, comb)
