"""Seeded random weights (`load_format="dummy"` and the embedded `tiny` model).

Scales are chosen so that every mechanism is exercised rather than sitting at a degenerate
point: unit-gain projections (attention is not uniform), non-zero sinks, gate position biases,
routing biases and hyper-connection bases, norm weights near one, and a hash-routing table that
sends each token to `top_k` distinct experts.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)

    def normal(shape: torch.Size, std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("embed_tokens.weight"):
                v = normal(p.shape, 1.0)
            elif leaf in ("fn", "hc_fn"):
                v = normal(p.shape, 0.02)
            elif leaf in ("base", "hc_base"):
                v = normal(p.shape, 0.5)
            elif leaf in ("scale", "hc_scale"):
                v = 0.5 + torch.rand(p.shape, generator=gen)
            elif leaf == "sinks":
                v = normal(p.shape, 1.0)
            elif leaf == "position_bias":
                v = normal(p.shape, 0.5)
            elif "norm" in name.rsplit(".", 2)[-2]:
                v = normal(p.shape, 0.1, mean=1.0)
            else:  # linear weights [out, in], stacked experts [E, out, in], the router
                v = normal(p.shape, 1 / math.sqrt(p.shape[-1]))
            p.copy_(v.to(p.dtype))
        for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("e_score_correction_bias"):
                b.copy_(normal(b.shape, 0.1).to(b.dtype))
            elif name.endswith("tid2eid"):
                vocab, k = b.shape
                n_experts = _experts_of(model, name)
                perm = torch.rand(vocab, n_experts, generator=gen).argsort(-1)[:, :k]
                b.copy_(perm.to(b.dtype))


def _experts_of(model: nn.Module, buffer_name: str) -> int:
    router = model.get_submodule(buffer_name.rsplit(".", 1)[0])
    return int(router.weight.shape[0])
