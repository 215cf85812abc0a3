"""The DSpark drafter (DeepSeek V4-Flash-DSpark, V4.1): modules under the checkpoint's names, and
a plain forward over whole sequences that autograd can train through.

A draft block starts at an anchor: the last committed token (the bonus token the target just
sampled), at position p, whose own target hidden state does not exist yet. The block's input is
[anchor, noise x (block_size - 1)] at positions p .. p + block_size - 1, and position k predicts
the token at p + k + 1, so one block drafts `block_size` tokens in one pass.

What the drafter knows of the context is the target's hidden state after each of
`target_layer_ids` (the mean of the hyper-connection streams: the "taps"), concatenated and fused
by stage 0's `main_proj` + `main_norm` into main_x. Each stage is a V4 block with sliding-window
attention only; its keys and values are the block's own rows (bidirectional within the block)
plus its own kv_proj/kv_norm/RoPE of main_x at the context positions p - window .. p - 1, so the
context costs one projection per stage and is never run through the stages.

After the last stage (hc_head, norm, the target's shared LM head) a Markov head adds a low-rank
bigram correction: logits'_k = U_k + W2 W1[x_{k-1}], with x_{-1} the anchor and x_{k-1} the
previous draft (greedy) or, in training, the previous true token. The confidence head predicts
c_k = P(draft k accepted | drafts before it accepted) = sigmoid(w . [h_k ; W1[x_{k-1}]]); the
prefix survival is prod_{i<=k} c_i, calibrated by per-position temperatures (sequential
temperature scaling, ModelConfig.dspark.confidence_temperatures).

Checkpoint names (original layout, renamed on load like the backbone's): `mtp.S.attn.*`,
`mtp.S.ffn.*`, `mtp.S.hc_attn_*`, ... per stage; `mtp.0.main_proj.weight` [D, n_taps * D],
`mtp.0.main_norm.weight`; on the last stage `norm.weight`, `hc_head_{fn,base,scale}`,
`markov_head.embed.weight` (W1) and `markov_head.head.weight` (W2), both [vocab, rank], and
`confidence_head.proj.weight` [1, D + rank] (no bias).

The plain forward below is the reference the engine's paged version is to be checked against:
straightforward torch (no kernels, no in-place ops on autograd tensors), one dense mask.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from deepring.model.config import MOE, SLIDING, DSparkConfig, ModelConfig
from deepring.model.hc import HyperConnection, HyperHead
from deepring.model.layer import DecoderLayer
from deepring.model.linear import linear
from deepring.model.moe import MoE
from deepring.model.norm import RMSNorm
from deepring.model.rope import RopeTables


class MarkovHead(nn.Module):
    """W1 (`embed`, [vocab, rank]) and W2 (`head`, [vocab, rank]): bias = W2 W1[prev]."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, rank)
        self.head = linear(rank, vocab_size)

    def bias(self, prev_ids: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[..., vocab] logit corrections for each previous token (only `rows` of the vocab
        when given: training restricts the softmax to the tokens its corpus uses)."""
        w = self.head.weight if rows is None else self.head.weight[rows]
        return F.linear(self.embed(prev_ids), w)


class ConfidenceHead(nn.Module):
    def __init__(self, hidden: int, rank: int) -> None:
        super().__init__()
        self.proj = linear(hidden + rank, 1)

    def forward(self, hidden: torch.Tensor, prev_embed: torch.Tensor) -> torch.Tensor:
        """Acceptance logits [...] from h_k [..., D] and W1[x_{k-1}] [..., rank]."""
        return self.proj(torch.cat([hidden, prev_embed.to(hidden.dtype)], -1)).squeeze(-1)


def stage_config(config: ModelConfig) -> ModelConfig:
    """The backbone's config with the drafter's own expert counts (V4.1 gives it fewer)."""
    ds = _dspark(config)
    return dataclasses.replace(
        config, n_routed_experts=ds.n_routed_experts, num_experts_per_tok=ds.num_experts_per_tok
    )


def _dspark(config: ModelConfig) -> DSparkConfig:
    if config.dspark is None:
        raise ValueError("this model config has no DSpark drafter")
    return config.dspark


class DSparkStage(DecoderLayer):
    """One draft stage: a sliding-only V4 block (learned-routed MoE) plus, on stage 0, the tap
    fusion and, on the last stage, the output collapse and the Markov and confidence heads."""

    def __init__(self, config: ModelConfig, stage: int) -> None:
        ds = _dspark(config)
        super().__init__(stage_config(config), SLIDING, MOE)
        d, eps = config.hidden_size, config.rms_norm_eps
        if stage == 0:
            self.main_proj = linear(len(ds.target_layer_ids) * d, d)
            self.main_norm = RMSNorm(d, eps)
        if stage == ds.num_stages - 1:
            self.norm = RMSNorm(d, eps)
            self.hc_head = HyperHead(config.hc_mult, d, config.hc_eps, eps)
            self.markov_head = MarkovHead(config.vocab_size, ds.markov_rank)
            self.confidence_head = ConfidenceHead(d, ds.markov_rank)


class DrafterStages(nn.ModuleList):
    """Draft stages in a model's `mtp` slot (so their tensors are `mtp.S.*`), stage 0 owning
    `main_proj`: what V4's and V4.1's (model.v41.dspark) drafters share. The embedding and LM
    head are the target's, passed in."""

    def __init__(self, config, stages) -> None:
        super().__init__(stages)
        self.config = config
        self.ds = _dspark(config)
        self._rope: RopeTables | None = None

    @property
    def first(self) -> nn.Module:
        return self[0]

    @property
    def last(self) -> nn.Module:
        return self[len(self) - 1]

    def rope(self) -> RopeTables:
        dev = self.first.main_proj.weight.device
        if self._rope is None or self._rope.main.device != dev:
            self._rope = RopeTables(self.config, dev)
        return self._rope


class DSparkDrafter(DrafterStages):
    """V4's drafter: its stages, the plain forward and the engine's incremental form."""

    def __init__(self, config: ModelConfig) -> None:
        ds = _dspark(config)
        super().__init__(config, (DSparkStage(config, s) for s in range(ds.num_stages)))

    # ---- the plain forward -------------------------------------------------------------------

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """main_x [..., D] = main_norm(main_proj(concatenated taps)), taps [..., n_taps, D] in
        the order of target_layer_ids."""
        want = (len(self.ds.target_layer_ids), self.config.hidden_size)
        if taps.dim() < 2 or tuple(taps.shape[-2:]) != want:
            raise ValueError(f"taps must be [..., {want[0]}, {want[1]}], got {tuple(taps.shape)}")
        first = self.first
        x = taps.flatten(-2).to(first.main_proj.weight.dtype)
        return _rms(first.main_proj(x), first.main_norm)

    def block_hidden(
        self,
        taps: torch.Tensor,
        anchor_ids: torch.Tensor,
        anchor_pos: torch.Tensor,
        embed: nn.Embedding,
    ) -> torch.Tensor:
        """The last stage's output h [B, A, block_size, D] (after hc_head and norm: what the LM
        head, the Markov head and the confidence head read).

        taps: [B, S, n_taps, D], the target's taps at positions 0 .. S-1; anchor_ids,
        anchor_pos: [B, A] each block's anchor token and position (1 <= pos <= S: a block
        sees the taps before its anchor, at most `sliding_window` of them)."""
        b, s = taps.shape[:2]
        a, g = anchor_ids.shape[1], self.ds.block_size
        if anchor_pos.shape != anchor_ids.shape or anchor_pos.shape[0] != b:
            raise ValueError("anchor_ids and anchor_pos must both be [B, A]")
        dev = taps.device
        ids = torch.full((b, a, g), self.ds.noise_token_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = anchor_ids
        pos = anchor_pos[:, :, None] + torch.arange(g, device=dev)  # [B, A, g]
        pos = pos.reshape(b, a * g)
        ctx_pos = torch.arange(s, device=dev)
        mask = _block_mask(anchor_pos, s, g, self.config.sliding_window)  # [B, A*g, S + A*g]
        main_x = self.fuse(taps)
        dt = main_x.dtype
        x = embed(ids.reshape(b, a * g)).to(dt)
        h = x.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1)
        rope = self.rope()
        ctx_cs = tuple(t[None] for t in rope.cos_sin(ctx_pos, "main"))
        blk_cs = rope.cos_sin(pos, "main")
        for stage in self:
            ctx_kv = _kv(stage, main_x, ctx_cs)
            h = _stage(stage, h, ctx_kv, blk_cs, mask)
        last = self.last
        out = _rms(_hc_head(last.hc_head, h), last.norm)
        return out.view(b, a, g, -1)

    # ---- the engine's incremental form -------------------------------------------------------

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> list[torch.Tensor]:
        """Each stage's context K=V rows [N, head_dim] for the taps [N, n_taps, D] of N
        positions: what a serving engine keeps per request (one ring per stage) instead of
        the taps themselves."""
        main_x = self.fuse(taps)
        cs = self.rope().cos_sin(positions, "main")
        return [_kv(stage, main_x, cs) for stage in self]

    def block_from_context(
        self,
        ctx_kv: list[torch.Tensor],
        ctx_valid: torch.Tensor,
        anchor_ids: torch.Tensor,
        anchor_pos: torch.Tensor,
        embed: nn.Embedding,
    ) -> torch.Tensor:
        """block_hidden for one block per request from kept context rows: ctx_kv, per stage,
        [B, S, head_dim] (context_kv of S kept positions, in any order), ctx_valid [B, S] the
        rows the block may see (its anchor's window), anchor_ids and anchor_pos [B].
        Returns h [B, block_size, D]."""
        b, g = anchor_ids.shape[0], self.ds.block_size
        if len(ctx_kv) != len(self) or ctx_valid.shape[0] != b or anchor_pos.shape != (b,):
            raise ValueError("one context per stage, and one anchor and valid row per request")
        dev = anchor_ids.device
        ids = torch.full((b, g), self.ds.noise_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = anchor_ids
        pos = anchor_pos[:, None] + torch.arange(g, device=dev)
        own = torch.ones(b, g, g, dtype=torch.bool, device=dev)
        mask = torch.cat([ctx_valid[:, None, :].expand(-1, g, -1), own], -1)
        dt = self.first.main_proj.weight.dtype
        h = embed(ids).to(dt).unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1)
        h = h.reshape(b * g, self.config.hc_mult, -1).contiguous()
        cs = self.rope().cos_sin(pos, "main")
        no_ids = torch.zeros(b * g, dtype=torch.long, device=dev)  # learned routing: unused
        for stage, kv in zip(self, ctx_kv, strict=True):
            # The plain _stage's math through the engine's modules (hyper-connection kernels,
            # packed MoE): a serving step's drafter cost is mostly these small ops.
            post, comb, x = stage.attn_hc(h)
            a = _attention(stage, stage.input_layernorm(x).view(b, g, -1), kv.to(dt), cs, mask)
            h = HyperConnection.merge(h, a.reshape(b * g, -1), post, comb)
            post, comb, x = stage.ffn_hc(h)
            h = HyperConnection.merge(
                h, stage.mlp(stage.post_attention_layernorm(x), no_ids), post, comb
            )
        last = self.last
        return last.norm(last.hc_head(h)).view(b, g, -1)

    def draft_block(self, ctx_kv, ctx_valid, anchor_ids, anchor_pos, embed):
        """block_from_context as the engine's drafter reads it: (the heads' input, the
        confidence head's input), one tensor here (V4.1's differ: model.v41.dspark)."""
        h = self.block_from_context(ctx_kv, ctx_valid, anchor_ids, anchor_pos, embed)
        return h, h

    def markov_bias(self, prev_ids: torch.Tensor, rows: torch.Tensor | None = None):
        return self.last.markov_head.bias(prev_ids, rows)

    def confidence_logits(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """Acceptance logits z_k (c_k = sigmoid(z_k)) for h_k with the previous tokens."""
        last = self.last
        return last.confidence_head(hidden, last.markov_head.embed(prev_ids))

    def survival(self, conf_logits: torch.Tensor) -> torch.Tensor:
        """The calibrated prefix survival a_k = prod_{i<=k} sigmoid(z_i / T_i) over the last
        axis (the draft positions)."""
        temps = self.ds.confidence_temperatures
        z = conf_logits.float()
        if temps:
            t = torch.tensor(temps[: z.shape[-1]], dtype=z.dtype, device=z.device)
            z = z / t
        return torch.sigmoid(z).cumprod(-1)

    def draft_greedy(
        self, hidden: torch.Tensor, anchor_ids: torch.Tensor, lm_head: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Greedy drafts from block hidden states [..., g, D]: position by position, the
        argmax of U_k + W2 W1[x_{k-1}] with x_{-1} = the anchor. Returns the draft tokens
        [..., g], the corrected logits [..., g, vocab] and the confidence logits [..., g]."""
        base = F.linear(hidden, lm_head.to(hidden.dtype)).float()
        prev = anchor_ids
        toks, logits, prevs = [], [], []
        for k in range(hidden.shape[-2]):
            step = base[..., k, :] + self.markov_bias(prev).float()
            prevs.append(prev)
            prev = step.argmax(-1)
            toks.append(prev)
            logits.append(step)
        prev_ids = torch.stack(prevs, -1)
        return (
            torch.stack(toks, -1),
            torch.stack(logits, -2),
            self.confidence_logits(hidden, prev_ids).float(),
        )


# ---- the math of one stage, plainly ------------------------------------------------------------


def _rms(x: torch.Tensor, norm: RMSNorm | None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm in fp32 (weighted by `norm` if given), back in x's dtype."""
    xf = x.float()
    e = norm.eps if norm is not None else eps
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + e)
    if norm is not None:
        y = y * norm.weight.float()
    return y.to(x.dtype)


def _rope(x: torch.Tensor, cs: tuple[torch.Tensor, torch.Tensor], inverse: bool = False):
    """Interleaved RoPE on the trailing channels; x [B, T, (H,) hd], cos/sin [B or 1, T, r/2]."""
    cos, sin = cs
    r = cos.shape[-1] * 2
    if x.dim() == cos.dim() + 1:  # broadcast over the heads
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    nope, rot = x[..., :-r], x[..., -r:].float()
    re, im = rot[..., 0::2], rot[..., 1::2]
    sin = -sin if inverse else sin
    out = torch.stack([re * cos - im * sin, re * sin + im * cos], -1).flatten(-2)
    return torch.cat([nope, out.to(x.dtype)], -1)


def _block_mask(anchor_pos: torch.Tensor, s: int, g: int, window: int) -> torch.Tensor:
    """[B, A*g, S + A*g] bool: block row (a, k) sees context positions anchor_a - window ..
    anchor_a - 1 and every row of its own block (bidirectional), nothing else."""
    b, a = anchor_pos.shape
    dev = anchor_pos.device
    p = anchor_pos.repeat_interleave(g, dim=1)[:, :, None]  # [B, A*g, 1]
    j = torch.arange(s, device=dev)
    ctx = (j < p) & (j >= p - window)
    blk_of_row = torch.arange(a * g, device=dev) // g
    own = blk_of_row[:, None] == blk_of_row[None, :]  # [A*g, A*g]
    return torch.cat([ctx, own.expand(b, -1, -1)], -1)


def _kv(stage: DSparkStage, x: torch.Tensor, cs) -> torch.Tensor:
    """The stage's K=V rows for inputs x [B, T, D] at the positions of cs."""
    att = stage.self_attn
    return _rope(_rms(att.kv_proj(x), att.kv_norm), cs)


def _attention(
    stage: DSparkStage, x: torch.Tensor, ctx_kv: torch.Tensor, cs, mask: torch.Tensor
) -> torch.Tensor:
    """Block rows x [B, T, D] (already input-normed) over [context K=V ; block K=V]."""
    att = stage.self_attn
    b, t, _ = x.shape
    q = att.q_b_proj(_rms(att.q_a_proj(x), att.q_a_norm)).view(b, t, att.heads, att.head_dim)
    q = _rope(_rms(q, None, att.eps), cs)
    kv = torch.cat([ctx_kv, _kv(stage, x, cs)], 1)  # [B, S + T, hd]
    scores = torch.einsum("bthd,bsd->bhts", q.float(), kv.float()) * att.scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    sinks = att.sinks.float().view(1, -1, 1, 1).expand(b, -1, t, 1)
    probs = torch.softmax(torch.cat([scores, sinks], -1), -1)[..., :-1]
    out = torch.einsum("bhts,bsd->bthd", probs, kv.float()).to(x.dtype)
    out = _rope(out, cs, inverse=True)
    grouped = out.reshape(b, t, att.groups, -1)
    w = att.o_a_proj.weight.view(att.groups, -1, grouped.shape[-1])
    return att.o_b_proj(torch.einsum("btgi,goi->btgo", grouped, w).reshape(b, t, -1))


def _hc_pre(hc: HyperConnection, h: torch.Tensor):
    """post [.., hc], comb [.., hc, hc] (comb[j, k]: stream j into k), collapsed input."""
    n = hc.hc
    flat = _rms(h.flatten(-2).float(), None, hc.norm_eps)
    z = F.linear(flat, hc.fn.float())
    pre_w, post_w, comb_w = z.split([n, n, n * n], -1)
    pre_b, post_b, comb_b = hc.base.float().split([n, n, n * n])
    s_pre, s_post, s_comb = hc.scale.float().unbind(0)
    pre = torch.sigmoid(pre_w * s_pre + pre_b) + hc.hc_eps
    post = 2 * torch.sigmoid(post_w * s_post + post_b)
    logits = comb_w.view(*comb_w.shape[:-1], n, n) * s_comb + comb_b.view(n, n)
    comb = torch.softmax(logits, -1) + hc.hc_eps
    comb = comb / (comb.sum(-2, keepdim=True) + hc.hc_eps)
    for _ in range(hc.iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hc.hc_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + hc.hc_eps)
    collapsed = (pre.unsqueeze(-1) * h.float()).sum(-2).to(h.dtype)
    return post, comb, collapsed


def _hc_merge(h, out, post, comb) -> torch.Tensor:
    dt = h.dtype
    mixed = torch.matmul(comb.to(dt).transpose(-1, -2), h)
    return post.to(dt).unsqueeze(-1) * out.unsqueeze(-2) + mixed


def _hc_head(head: HyperHead, h: torch.Tensor) -> torch.Tensor:
    flat = _rms(h.flatten(-2).float(), None, head.norm_eps)
    mix = F.linear(flat, head.hc_fn.float())
    pre = torch.sigmoid(mix * head.hc_scale.float() + head.hc_base.float()) + head.hc_eps
    return (pre.unsqueeze(-1) * h.float()).sum(-2).to(h.dtype)


def _moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Learned top-k routing (the bias only steers the choice), routed experts plus the shared
    one, all with V4's clamped SwiGLU; x [..., D]."""
    gate, ex, sh = moe.gate, moe.experts, moe.shared_experts
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    logits = F.linear(x.float(), gate.weight.float())
    if gate.func == "sqrtsoftplus":
        scores = F.softplus(logits).sqrt()
    elif gate.func == "softmax":
        scores = torch.softmax(logits, -1)
    else:
        scores = torch.sigmoid(logits)
    idx = torch.topk(scores.detach() + gate.e_score_correction_bias, gate.top_k, -1).indices
    w = scores.gather(1, idx)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * gate.scaling
    out = torch.zeros_like(x)
    for e in torch.unique(idx).tolist():
        rows, slot = torch.nonzero(idx == e, as_tuple=True)
        g, u = F.linear(x[rows], ex.gate_up_proj[e]).chunk(2, -1)
        y = F.linear(_swiglu(g, u, ex.limit), ex.down_proj[e])
        out = out.index_add(0, rows, y * w[rows, slot, None].to(y.dtype))
    shared = sh.down_proj(_swiglu(sh.gate_proj(x), sh.up_proj(x), sh.limit))
    return (out + shared).view(shape)


def _swiglu(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    return F.silu(g.clamp(max=limit)) * u.clamp(min=-limit, max=limit)


def _stage(stage: DSparkStage, h, ctx_kv, cs, mask) -> torch.Tensor:
    post, comb, x = _hc_pre(stage.attn_hc, h)
    a = _attention(stage, _rms(x, stage.input_layernorm), ctx_kv, cs, mask)
    h = _hc_merge(h, a, post, comb)
    post, comb, x = _hc_pre(stage.ffn_hc, h)
    m = _moe(stage.mlp, _rms(x, stage.post_attention_layernorm))
    return _hc_merge(h, m, post, comb)


DRAFT_VOCAB_FILE = "draft_vocab.json"


def read_draft_vocab(path: Path | None, vocab_size: int) -> torch.Tensor | None:
    """The drafter's candidate tokens from the checkpoint directory's draft_vocab.json (a JSON
    list of distinct token ids, most frequent first), or None when there is none (drafts range
    over the whole vocabulary).

    Why: a draft is only a proposal (verification decides), so the drafter may propose from
    the tokens the model actually produces instead of scoring the whole vocabulary twice per
    position (its LM-head GEMM and the Markov head's rank-r term are most of a propose step on
    CPU). This is FR-Spec's frequency-ranked draft vocabulary (Zhao et al., 2025); a token
    outside the list can still be emitted, by the target, as the bonus token of a step."""
    if path is None or not (path / DRAFT_VOCAB_FILE).is_file():
        return None
    where = path / DRAFT_VOCAB_FILE
    try:
        ids = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: not a JSON list of token ids ({e})") from e
    if not isinstance(ids, list) or not ids:
        raise ValueError(f"{where}: expected a non-empty JSON list of token ids")
    if not all(type(i) is int and 0 <= i < vocab_size for i in ids):
        raise ValueError(f"{where}: every entry must be a token id in [0, {vocab_size})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: token ids must be distinct")
    return torch.tensor(ids, dtype=torch.long)
