"""The multi-token-prediction (MTP) layer, kept for speculative decoding.

It is a full decoder block whose input mixes the embedding of the next token with the backbone's
final hyper-connection streams at the current position: e_proj(enorm(embed(t+1))) is added to
h_proj(hnorm(h_t)) on every stream. It shares the backbone's embedding and LM head, and has its
own stream collapse (hc_head) and output norm. Its cache is pool.layers[num_hidden_layers + i].
"""

from __future__ import annotations

import torch

from deepring.cache.pool import LayerCache
from deepring.model.batch import ForwardBatch
from deepring.model.config import MOE, ModelConfig
from deepring.model.hc import HyperHead
from deepring.model.layer import DecoderLayer
from deepring.model.linear import linear
from deepring.model.norm import RMSNorm


class MTPLayer(DecoderLayer):
    def __init__(self, config: ModelConfig, layer_type: str) -> None:
        super().__init__(config, layer_type, MOE)
        d = config.hidden_size
        self.e_proj = linear(d, d)
        self.h_proj = linear(d, d)
        self.enorm = RMSNorm(d, config.rms_norm_eps)
        self.hnorm = RMSNorm(d, config.rms_norm_eps)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.hc_head = HyperHead(config.hc_mult, d, config.hc_eps, config.rms_norm_eps)

    def forward_mtp(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        next_ids: torch.Tensor,
        batch: ForwardBatch,
        cache: LayerCache,
    ) -> torch.Tensor:
        """hidden: [T, hc, D] backbone streams; embeds: [T, D] embeddings of next_ids.
        Returns the MTP layer's output streams [T, hc, D]."""
        h = self.e_proj(self.enorm(embeds)).unsqueeze(1) + self.h_proj(self.hnorm(hidden))
        return self.forward(h, next_ids, batch, cache)

    def collapse(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.hc_head(h))
