"""V4.1's DSpark drafter: its stages under the checkpoint's names, and the incremental form the
engine drafts with (core.drafters.DSparkContext), the same interface as V4's
(model.dspark.DSparkDrafter).

What differs from V4's (DeepInfer 0.1.0's `models/mtp/dflash.py`, `decoder_layer.py`):
- the taps are the mean of the hyper-connection streams at each target layer's attention input
  (after Engram), not after the layer (DeepseekV41.forward; all targets on one side of the
  decoder boundary, so they exist for the same rows);
- the stages are V4.1 blocks (model.v41.layer: shifted single-pass hyper-connections, the
  drafter's own smaller MoE, window attention without a per-head query norm); the block's
  first sublayer reads stream 0 (the embedding) and the output is the streams collapsed with
  the last sublayer's pre mix (no HC head);
- the confidence head reads that collapsed output before the final norm; the LM head and the
  Markov head read it after.

Context: stage 0's `main_proj` + `main_norm` fuse the taps into main_x; each stage's own
`wkv` + `kv_norm` + RoPE of main_x at the context positions are its context K=V rows (kept in
the stage's window ring by the engine). A block [anchor, noise x (g - 1)] at the anchor's
position p .. p + g - 1 attends to those rows at p - window .. p - 1 and bidirectionally to its
own rows.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from deepring.kernels.hyper import collapse
from deepring.model.dspark import DrafterStages
from deepring.model.linear import linear
from deepring.model.norm import RMSNorm
from deepring.model.v41.attention import V41Attention
from deepring.model.v41.config import V41Config
from deepring.model.v41.layer import V41Block, V41MoE


class MarkovHead(nn.Module):
    def __init__(self, vocab: int, rank: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, rank)  # W1: the previous token -> rank
        self.head = nn.Embedding(vocab, rank)  # W2: rank -> vocab bias (weight [vocab, rank])


class DSparkStage(V41Block):
    def __init__(self, config: V41Config, index: int) -> None:
        c, ds = config, config.dspark
        layer = c.num_hidden_layers + index
        super().__init__(
            c,
            layer,
            attn=V41Attention(c, layer, window_only=True),
            moe=V41MoE(c, ds.n_routed_experts, ds.num_experts_per_tok),
        )
        d = c.hidden_size
        if index == 0:
            self.main_proj = linear(len(ds.target_layer_ids) * d, d)
            self.main_norm = RMSNorm(d, c.rms_norm_eps)
        if index == ds.num_stages - 1:
            self.norm = RMSNorm(d, c.rms_norm_eps)
            self.markov_head = MarkovHead(c.vocab_size, ds.markov_rank)
            self.confidence_head = nn.Module()
            self.confidence_head.proj = linear(d + ds.markov_rank, 1)


class V41Drafter(DrafterStages):
    """The stages, in the model's `mtp` slot (tensors `mtp.S.*`)."""

    def __init__(self, config: V41Config) -> None:
        if config.dspark is None:
            raise ValueError("this model config has no DSpark drafter")
        super().__init__(config, (DSparkStage(config, s) for s in range(config.dspark.num_stages)))

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """main_x [N, D] from the taps [N, n_taps, D] (target_layer_ids order)."""
        want = (len(self.ds.target_layer_ids), self.config.hidden_size)
        if taps.dim() != 3 or tuple(taps.shape[1:]) != want:
            raise ValueError(f"taps must be [N, {want[0]}, {want[1]}], got {tuple(taps.shape)}")
        first = self.first
        return first.main_norm(first.main_proj(taps.flatten(1).to(first.main_proj.weight.dtype)))

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> list[torch.Tensor]:
        """Each stage's context K=V rows [N, head_dim] for the taps of N positions."""
        main_x = self.fuse(taps)
        cos, sin = self.rope().cos_sin(positions, "main")
        return [stage.attn.window_keys(main_x, cos, sin) for stage in self]

    def draft_block(
        self,
        ctx_kv: list[torch.Tensor],
        ctx_valid: torch.Tensor,
        anchor_ids: torch.Tensor,
        anchor_pos: torch.Tensor,
        embed: nn.Embedding,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block per request from kept context rows: ctx_kv per stage [B, S, head_dim],
        ctx_valid [B, S] the rows each block sees, anchor_ids and anchor_pos [B]. Returns the
        LM / Markov heads' input and the confidence head's, each [B, block_size, D]."""
        b, g = anchor_ids.shape[0], self.ds.block_size
        if len(ctx_kv) != len(self) or ctx_valid.shape[0] != b or anchor_pos.shape != (b,):
            raise ValueError("one context per stage, and one anchor and valid row per request")
        dev = anchor_ids.device
        ids = torch.full((b, g), self.ds.noise_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = anchor_ids
        pos = (anchor_pos[:, None] + torch.arange(g, device=dev)).reshape(-1)
        cos, sin = self.rope().cos_sin(pos, "main")
        x = embed(ids.reshape(-1)).to(self.first.main_proj.weight.dtype)
        hc = self.config.hc_mult
        h = x.unsqueeze(1).expand(-1, hc, -1).contiguous()
        pre = torch.zeros(b * g, hc, dtype=torch.float32, device=dev)
        pre[:, 0] = 1.0  # shifted HC: the first sublayer reads the embedding itself
        for stage, kv in zip(self, ctx_kv, strict=True):
            attend = partial(_block_attention, stage.attn, ctx=kv, valid=ctx_valid, b=b, g=g,
                             cos=cos, sin=sin)  # fmt: skip
            h, pre = stage.sublayers(h, pre, attend)
        y = collapse(pre, h)
        return self.last.norm(y).view(b, g, -1), y.view(b, g, -1)

    def confidence_logits(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """Acceptance logits z_k from the confidence input h_k and W1[x_{k-1}]."""
        last = self.last
        w1 = last.markov_head.embed(prev_ids).to(hidden.dtype)
        return last.confidence_head.proj(torch.cat([hidden, w1], -1)).squeeze(-1)


def _block_attention(
    attn: V41Attention,
    x: torch.Tensor,
    ctx: torch.Tensor,
    valid: torch.Tensor,
    b: int,
    g: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """A stage's attention for b blocks of g rows (x [b g, D], normed): over the context rows
    `ctx` [b, S, hd] where `valid` [b, S] and every row of the own block, with the sinks."""
    _, q, kv = attn.project(x, cos, sin)
    q = q.view(b, g, attn.heads, attn.hd)
    keys = torch.cat([ctx.to(kv.dtype), kv.view(b, g, -1)], 1)  # [b, S + g, hd]
    logit = torch.einsum("bghd,bsd->bghs", q, keys) * attn.hd**-0.5
    see = torch.cat([valid, torch.ones(b, g, dtype=torch.bool, device=valid.device)], 1)
    logit = logit.masked_fill(~see[:, None, None], float("-inf"))
    sink = attn.attn_sink.to(logit.dtype).view(1, 1, -1, 1).expand(b, g, -1, 1)
    probs = torch.softmax(torch.cat([logit, sink], -1).float(), -1).to(q.dtype)
    out = torch.einsum("bghs,bsd->bghd", probs[..., :-1], keys)
    return attn.output(out.reshape(b * g, attn.heads, attn.hd), cos, sin)
