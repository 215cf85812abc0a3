"""A V4.1 block: (Engram,) attention and MoE, each behind a shifted hyper-connection.

Shifted single-pass mHC: a sublayer's one mix projection of its input streams R gives the
`post` and `comb` of its own merge and the `pre` mix the *next* sublayer collapses its input
with (the first sublayer takes stream 0; the model collapses the final streams with the last
sublayer's pre). So the collapse of a sublayer's input never waits for a projection of the
same streams, which is what lets one kernel do a merge and the next collapse back to back.

MoE: sqrt(softplus) scores, top-k by score + bias (noaux_tc), the chosen scores renormalised
and scaled; clamped SwiGLU experts plus shared experts. No hash routing. `gate.bias_vl` is the
routing bias for image tokens (ForwardBatch.image_mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepring.kernels.hyper import collapse, hc_merge, hc_pre, rms_mix
from deepring.kernels.moe import clamped_swiglu
from deepring.model.linear import linear
from deepring.model.norm import RMSNorm
from deepring.model.v41.attention import StepShare, V41Attention
from deepring.model.v41.config import V41Config
from deepring.model.v41.engram import Engram


class Expert(nn.Module):
    def __init__(self, dim: int, inter: int, limit: float) -> None:
        super().__init__()
        self.limit = limit
        self.w1 = linear(dim, inter)
        self.w2 = linear(inter, dim)
        self.w3 = linear(dim, inter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(clamped_swiglu(self.w1(x), self.w3(x), self.limit))


class Gate(nn.Module):
    def __init__(self, config: V41Config, n_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_experts, config.hidden_size))
        self.bias = nn.Parameter(torch.zeros(n_experts, dtype=torch.float32))
        self.bias_vl = nn.Parameter(torch.zeros(n_experts, dtype=torch.float32))


class V41MoE(nn.Module):
    def __init__(self, config: V41Config, n_experts: int, top_k: int) -> None:
        super().__init__()
        d, i = config.hidden_size, config.moe_intermediate_size
        self.top_k, self.scaling = top_k, config.routed_scaling_factor
        self.gate = Gate(config, n_experts)
        self.experts = nn.ModuleList(Expert(d, i, config.swiglu_limit) for _ in range(n_experts))
        self.shared_experts = Expert(d, i * config.n_shared_experts, config.swiglu_limit)

    def forward(self, x: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
        """image: [T] bool, rows routed with the image bias `bias_vl` (DeepInfer's gate)."""
        scores = torch.sqrt(F.softplus(F.linear(x.float(), self.gate.weight.float())))
        bias = self.gate.bias
        if image is not None:
            bias = torch.where(image[:, None], self.gate.bias_vl, bias)
        chosen = (scores + bias).topk(self.top_k, dim=-1).indices
        w = scores.gather(1, chosen)
        w = (w / w.sum(-1, keepdim=True) * self.scaling).to(x.dtype)
        out = self.shared_experts(x)
        for e in chosen.unique().tolist():
            rows, k = (chosen == e).nonzero(as_tuple=True)
            out.index_add_(0, rows, self.experts[e](x[rows]) * w[rows, k, None])
        return out


class ShiftedHC:
    """A sublayer's mixes from fn [(2 + hc) hc, hc D], base [(2 + hc) hc], scale [3] (the
    parameters live on the block under the checkpoint's names)."""

    def __init__(self, config: V41Config) -> None:
        self.hc, self.iters = config.hc_mult, config.hc_sinkhorn_iters
        self.hc_eps, self.norm_eps = config.hc_eps, config.rms_norm_eps

    def mixes(self, fn, base, scale, h: torch.Tensor):
        """(pre for the next sublayer [T, hc], post [T, hc], comb_t [T, hc, hc]).

        post and comb come from the engine's fused mHC kernel (numba on CPU, Triton on CUDA;
        V4's kernel: it also collapses the streams with the *current* pre, which shifted HC
        does not use, and costs less than the Sinkhorn iterations it saves); the pre mix is the
        first hc rows of the same projection."""
        hc = self.hc
        s = torch.cat([scale[0:1].expand(hc), scale[1:2].expand(hc), scale[2:3].expand(hc * hc)])
        post, comb_t, _ = hc_pre(h, fn, base, s, self.iters, self.hc_eps, self.norm_eps)
        z = rms_mix(h, fn[:hc], self.norm_eps) * scale[0] + base[:hc]
        return torch.sigmoid(z) + self.hc_eps, post, comb_t


class V41Block(nn.Module):
    def __init__(
        self,
        config: V41Config,
        layer: int,
        attn: V41Attention | None = None,
        moe: V41MoE | None = None,
        lookup: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        c = config
        self.layer = layer
        self.attn = attn if attn is not None else V41Attention(c, layer)
        self.ffn = moe if moe is not None else V41MoE(c, c.n_routed_experts, c.num_experts_per_tok)
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.ffn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        n = (2 + c.hc_mult) * c.hc_mult
        for part in ("attn", "ffn"):
            fan = c.hc_mult * c.hidden_size
            self.register_parameter(f"hc_{part}_fn", nn.Parameter(torch.zeros(n, fan)))
            self.register_parameter(f"hc_{part}_base", nn.Parameter(torch.zeros(n)))
            self.register_parameter(f"hc_{part}_scale", nn.Parameter(torch.ones(3)))
        self._hc = ShiftedHC(c)
        has_engram = c.engram is not None and layer in c.engram.layer_ids
        self.engram = Engram(c, layer, lookup) if has_engram else None

    def forward(
        self,
        h: torch.Tensor,
        pre: torch.Tensor,
        ngram_ids: torch.Tensor | None,
        batch,
        cache,
        share: StepShare,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, hc, D] streams, pre [T, hc] the previous sublayer's pre mix; returns both for
        the next block."""
        img = batch.image_mask  # image rows: no Engram, the image routing bias
        if self.engram is not None:
            h = self.engram(h, ngram_ids, img)
        if share.taps is not None and self.layer in share.taps:
            # A DSpark target: the mean of the streams at the attention's input (DeepInfer's
            # dflash_input_store, after Engram).
            share.tapped[self.layer] = h.float().mean(1).to(h.dtype)
        return self.sublayers(h, pre, lambda x: self.attn(x, batch, cache, share), img)

    def sublayers(self, h, pre, attend, img: torch.Tensor | None = None):
        """The attention sublayer (`attend`: normed input rows -> output rows) and the MoE,
        each behind its shifted hyper-connection: (streams, pre mix of the next sublayer)."""
        nxt, post, comb = self._hc.mixes(self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, h)
        x = collapse(pre, h)
        h = hc_merge(h, attend(self.attn_norm(x)), post, comb)
        pre = nxt
        nxt, post, comb = self._hc.mixes(self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, h)
        x = collapse(pre, h)
        h = hc_merge(h, self.ffn(self.ffn_norm(x), img), post, comb)
        return h, nxt
