"""V4.1 attention: a sliding window on every layer plus CSA2's shared compressed main KV.

Every layer computes its own query (low-rank, RoPE on the trailing channels) and its own
window key (K = V, one head). Compressed layers also attend to `index_topk` entries of the main
KV owned by their KV source, chosen by the lightning indexer (Full / Reindex) or taken from the
latest index source (Reuse). A query at position p sees entry w only once its window is
complete: w < (p + 1) // ratio. Per-head sinks join the softmax denominator; the output is
rotated back at p (K = V carried RoPE) and goes through the grouped low-rank projection.

The step's cross-layer values (the decoder's shared input, each index source's top-k, the
candidate pool) travel in a `StepShare`. Attention here is plain torch, one request at a time
over gathered keys: correct on CPU and for the tiny models; not a fast kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from deepring.cache.pool import LayerCache
from deepring.kernels.rope import apply_rope_torch
from deepring.model.batch import ForwardBatch
from deepring.model.linear import grouped_linear, linear
from deepring.model.norm import RMSNorm
from deepring.model.v41.config import FULL, REINDEX, WINDOW, V41Config
from deepring.model.v41.kvquant import KVCodec


@dataclass
class StepShare:
    """Values one layer hands to later layers within a step."""

    caches: list[LayerCache]
    codec: KVCodec
    shared_hidden: torch.Tensor | None = None  # the decoder's KV input (boundary layer's x)
    # Per request, the first position whose window key exists beyond the batch's own floors
    # (the decoder's bounded replay); None: none.
    floors: list[int] | None = None
    topk: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # layer -> per request
    candidates: list[torch.Tensor] | None = None  # per request [n, entries] bool
    # (KV source, index-K source) -> per request its (main entries, indexer keys)
    entries: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = field(
        default_factory=dict
    )
    # DSpark targets whose taps the step returns (None: none), and the taps taken so far:
    # layer -> [rows, D] in the numbering of the rows that layer ran on.
    taps: tuple[int, ...] | None = None
    tapped: dict[int, torch.Tensor] = field(default_factory=dict)
    # The rows the layers run on, in the step's numbering (None: every row; the decoder's
    # bounded replay leaves some out).
    rows: torch.Tensor | None = None


def visible_entries(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """Compressed entries a query at each position may attend to: complete windows only."""
    return torch.div(positions + 1, ratio, rounding_mode="floor")


def _top(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row, ties to the lower index. With few indexer heads, scores tie
    exactly (ReLU zeros every head), and torch.topk breaks ties arbitrarily: the rule must be
    fixed for batched, chunked and whole prefill to agree. (DeepInfer's DeepSelect order for
    ties is not visible in its sdist.)"""
    val, idx = torch.sort(scores, dim=1, descending=True, stable=True)
    return val[:, :k], idx[:, :k]


def candidate_blocks(scores: torch.Tensor, n_vis: torch.Tensor, block: int, keep: int):
    """The candidate pool of each row: the `keep` blocks of `block` consecutive entries with the
    highest maximum score, the block holding the newest visible entry always among them (so a
    query keeps its most recent context). scores [n, N] (-inf where invisible), n_vis [n].
    Returns [n, N] bool."""
    n, total = scores.shape
    nb = -(-total // block)
    padded = F.pad(scores, (0, nb * block - total), value=float("-inf"))
    block_scores = padded.view(n, nb, block).amax(-1)
    last = ((n_vis - 1).clamp(min=0) // block).unsqueeze(1)
    has = (n_vis > 0).unsqueeze(1)
    block_scores = block_scores.scatter(
        1, last, torch.where(has, float("inf"), block_scores.gather(1, last))
    )
    chosen = _top(block_scores, min(keep, nb))[1]
    mask = torch.zeros(n, nb, dtype=torch.bool, device=scores.device)
    mask.scatter_(1, chosen, True)
    return mask.repeat_interleave(block, dim=1)[:, :total]


def pool_windows(
    latent: torch.Tensor,
    score: torch.Tensor | None,
    offsets: list[int],
    lens: list[int],
    starts: list[int],
    slots: list[int],
    tail_kv: torch.Tensor | None,
    tail_gate: torch.Tensor | None,
    ratio: int,
    froms: list[int] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The entries each request's chunk completes, pooled, and their first positions.

    Windows are aligned groups of `ratio` tokens (C2: entry w pools positions 2w and 2w + 1 by
    a per-channel softmax of their gate rows; C1: entry w is row w). Rows of a window that
    began in an earlier step come from the request's tail (`tail_*[slot, pos % ratio]`), where
    each step leaves its last rows. Per request: pooled
    [E, width] and positions [E].

    froms: per request, the first position whose entries are not cached yet (a prefix hit
    replays window rows before it: their entries sit in shared blocks, never rewritten)."""
    ents, firsts = [], []
    dev = latent.device
    froms = froms if froms is not None else starts
    for off, n, start, slot, cfrom in zip(offsets, lens, starts, slots, froms, strict=True):
        # Entries ending at or after cfrom (a prefix hit's cfrom is a block edge, so a multiple
        # of the ratio: no entry straddles it); none for a replay chunk that ends before it.
        ws = torch.arange(cfrom // ratio, max(cfrom, start + n) // ratio, device=dev)
        if ratio == 1:
            ents.append(latent[off + cfrom - start : off + n])
        else:
            rows = ws[:, None] * ratio + torch.arange(ratio, device=dev)  # positions [E, r]
            in_chunk = (rows >= start)[..., None]
            idx = (rows - start + off).clamp(min=0)
            lat = torch.where(in_chunk, latent[idx], tail_kv[slot][rows % ratio].to(latent.dtype))
            sc = torch.where(in_chunk, score[idx], tail_gate[slot][rows % ratio].to(score.dtype))
            weights = torch.softmax(sc.float(), dim=1).to(lat.dtype)
            ents.append((lat * weights).sum(1))
            # The tail keeps the chunk's last `ratio` rows (a ring, as V4's compressor tails):
            # the incomplete window's are among them, the others are never read, and the
            # contents then depend on the positions fed, not on how they were chunked (a
            # speculative rollback rewrites exactly these: core.spec_rollback).
            for p in range(max(start, start + n - ratio), start + n):
                tail_kv[slot, p % ratio] = latent[off + p - start].to(tail_kv.dtype)
                tail_gate[slot, p % ratio] = score[off + p - start].to(tail_gate.dtype)
        firsts.append(ws * ratio)
    return ents, firsts


class Compressor(nn.Module):
    """A KV source's compressor: token rows `wkv` (and at ratio 2 gates `wgate`), pooled over
    aligned windows of `ratio` tokens by a per-channel softmax of the gates, then RMSNorm."""

    def __init__(self, config: V41Config, ratio: int) -> None:
        super().__init__()
        self.ratio = ratio
        self.wkv = linear(config.hidden_size, config.head_dim)
        self.wgate = linear(config.hidden_size, config.head_dim) if ratio > 1 else None
        self.norm = RMSNorm(config.head_dim, config.rms_norm_eps)


class Indexer(nn.Module):
    """Lightning indexer: score_w = sum_h weight_h * relu(q_h . k_w). Full layers also own the
    key projection from the (normalised, not yet rotated) main entry."""

    def __init__(self, config: V41Config, owns_keys: bool) -> None:
        super().__init__()
        self.heads, self.hd = config.index_n_heads, config.index_head_dim
        self.wq_b = linear(config.q_lora_rank, self.heads * self.hd)
        self.weights_proj = linear(config.hidden_size, self.heads)
        self.wk = linear(config.head_dim, self.hd) if owns_keys else None
        self.k_norm = RMSNorm(self.hd, config.rms_norm_eps) if owns_keys else None


class V41Attention(nn.Module):
    def __init__(self, config: V41Config, layer: int, window_only: bool = False) -> None:
        super().__init__()
        c = config
        self.config, self.layer = c, layer
        # window_only: a DSpark stage (past the backbone), sliding window only.
        self.mode = WINDOW if window_only else c.mode(layer)
        self.ratio = 0 if window_only else c.compress_ratios[layer]
        self.heads, self.hd, self.groups = c.num_attention_heads, c.head_dim, c.o_groups
        self.window = c.sliding_window
        self.rope_kind = "main" if self.mode == WINDOW else "compress"
        self.wq_a = linear(c.hidden_size, c.q_lora_rank)
        self.q_norm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.wq_b = linear(c.q_lora_rank, self.heads * self.hd)
        self.wkv = linear(c.hidden_size, self.hd)
        self.kv_norm = RMSNorm(self.hd, c.rms_norm_eps)
        # Grouped output projection: group g maps its heads' outputs to o_lora_rank.
        self.wo_a = linear(self.heads * self.hd // self.groups, self.groups * c.o_lora_rank)
        self.wo_b = linear(self.groups * c.o_lora_rank, c.hidden_size)
        self.attn_sink = nn.Parameter(torch.zeros(self.heads, dtype=torch.float32))
        self.compressor = Compressor(c, self.ratio) if self.mode == FULL else None
        self.indexer = Indexer(c, self.mode == FULL) if self.mode in (FULL, REINDEX) else None

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache, share: StepShare
    ) -> torch.Tensor:
        c = self.config
        cos, sin = batch.cos_sin(self.rope_kind)
        q_lora, q, kv = self.project(x, cos, sin)
        topk = None
        if self.mode == FULL and self.layer < c.boundary:
            # (Decoder sources were written at the boundary, from the last encoder layer's
            # output over every row: DeepseekV41._enter_decoder.)
            self.compress(x, batch, cache, share)
        if self.indexer is not None:
            topk = share.topk[self.layer] = self._select(q_lora, x, batch, share)
        elif self.mode != WINDOW:
            topk = share.topk[c.index_source(self.layer)]
        return self.output(self._attend(q, kv, topk, batch, cache, share), cos, sin)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The rows' query latent, queries [T, heads, hd] and window keys (K = V) [T, hd],
        rotated at their positions (cos, sin)."""
        q_lora = self.q_norm(self.wq_a(x))
        q = apply_rope_torch(self.wq_b(q_lora).view(-1, self.heads, self.hd), cos, sin)
        return q_lora, q, self.window_keys(x, cos, sin)

    def window_keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope_torch(self.kv_norm(self.wkv(x)), cos, sin)

    def output(self, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Attention outputs [T, heads, hd] rotated back at their positions (K = V carried
        RoPE), through the grouped low-rank projection: [T, hidden]."""
        out = apply_rope_torch(out, cos, sin, inverse=True)
        mixed = grouped_linear(out.reshape(out.shape[0], self.groups, -1), self.wo_a)
        return self.wo_b(mixed.reshape(out.shape[0], -1))

    # ---- the KV source's compressor --------------------------------------------------------

    def compress(
        self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache, share: StepShare
    ) -> None:
        """Pool the windows each request completes this step into the paged main KV and write
        their indexer keys; keep the rows of an incomplete window in the tail."""
        comp, r, lay = self.compressor, self.ratio, batch.layout
        latent = comp.wkv(x)
        score = comp.wgate(x) if comp.wgate is not None else None
        if batch.capture is not None and cache.tail_kv is not None:
            # A verify step's projections: rollback rewrites accepted rows of the tail.
            batch.capture.append((cache.tail_kv, cache.tail_gate, latent, score))
        epb = batch.block_size // r
        ents, pos_list = pool_windows(
            latent, score, lay.offsets, lay.lens, lay.starts, lay.slots.tolist(),
            cache.tail_kv, cache.tail_gate, r, batch.compress_from,
        )  # fmt: skip
        dests = []
        for s, ws in enumerate(pos_list):
            blocks = lay.block_tables[s, ws // batch.block_size]
            dests.append(blocks * epb + (ws // r) % epb)
        ents = [e for e in ents if e.shape[0]]
        if not ents:
            return
        normed = comp.norm(torch.cat(ents))
        pos = torch.cat(pos_list)  # each entry's first position
        cos, sin = batch.rope_tables.cos_sin(pos, "compress")
        main = apply_rope_torch(normed, cos, sin)
        keys = apply_rope_torch(self.indexer.k_norm(self.indexer.wk(normed)), cos, sin)
        dest = torch.cat(dests)
        share.codec.store_main(cache.comp, dest, main)
        share.codec.store_index(cache.index, dest, keys)

    def _entries(
        self, batch: ForwardBatch, share: StepShare, s: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Request s's visible main entries and indexer keys [N, hd], [N, index_hd] (N = the
        entries its last row sees), read from its KV / index-K sources' pages once per step."""
        c = self.config
        key = (c.kv_source(self.layer), c.index_k_source(self.layer))
        per = share.entries.setdefault(key, [])
        if not per:
            lay, r = batch.layout, self.ratio
            kv_cache, ix_cache = share.caches[key[0]], share.caches[key[1]]
            epb = batch.block_size // r
            for t in range(len(lay.lens)):
                n_ent = (lay.starts[t] + lay.lens[t]) // r
                ws = torch.arange(n_ent, device=batch.input_ids.device)
                flat = lay.block_tables[t, (ws * r) // batch.block_size] * epb + ws % epb
                per.append((share.codec.load_main(kv_cache.comp, flat),
                            share.codec.load_index(ix_cache.index, flat)))  # fmt: skip
        return per[s]

    # ---- the indexer -----------------------------------------------------------------------

    def _select(
        self, q_lora: torch.Tensor, x: torch.Tensor, batch: ForwardBatch, share: StepShare
    ) -> list[torch.Tensor]:
        """Per request, the top-k entry ids of each row ([n, k], -1 = none)."""
        c, ix, lay = self.config, self.indexer, batch.layout
        cos, sin = batch.cos_sin("compress")
        q = apply_rope_torch(ix.wq_b(q_lora).view(-1, ix.heads, ix.hd), cos, sin)
        head_w = ix.weights_proj(x).float()
        is_cand_src = self.layer == c.candidate_source_layer_id
        restricted = c.candidate_restricted(self.layer)
        if is_cand_src:
            share.candidates = []
        out = []
        for s in range(len(lay.lens)):
            off, n = lay.offsets[s], lay.lens[s]
            _, keys = self._entries(batch, share, s)
            pos = lay.positions[off : off + n]
            n_vis = visible_entries(pos, self.ratio)
            logits = torch.relu(torch.matmul(q[off : off + n].float(), keys.float().T))  # [n, h, m]
            scores = torch.bmm(head_w[off : off + n].unsqueeze(1), logits).squeeze(1)  # [n, m]
            ok = torch.arange(keys.shape[0], device=pos.device)[None] < n_vis[:, None]
            scores = scores.masked_fill(~ok, float("-inf"))
            if is_cand_src:
                share.candidates.append(candidate_blocks(
                    scores, n_vis, c.candidate_block_size, c.candidate_topk_blocks))  # fmt: skip
            if restricted:
                scores = scores.masked_fill(~share.candidates[s], float("-inf"))
            k = min(c.index_topk, keys.shape[0])
            if k == 0:
                out.append(torch.empty(n, 0, dtype=torch.long, device=pos.device))
                continue
            val, idx = _top(scores, k)
            out.append(idx.masked_fill(val == float("-inf"), -1))
        return out

    # ---- attention -------------------------------------------------------------------------

    def _attend(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        topk: list[torch.Tensor] | None,
        batch: ForwardBatch,
        cache: LayerCache,
        share: StepShare,
    ) -> torch.Tensor:
        lay, w = batch.layout, self.window
        if batch.is_decode and share.floors is None and lay.window_floors is None:
            return self._attend_decode(q, kv, topk, batch, cache, share)
        ring = cache.ring
        ring_len = ring.shape[1]
        scale = self.hd**-0.5
        out = torch.empty_like(q)
        for s in range(len(lay.lens)):
            off, n, start = lay.offsets[s], lay.lens[s], lay.starts[s]
            slot = int(lay.slots[s])
            floor = max(lay.floor(s), share.floors[s] if share.floors is not None else 0)
            lo = max(floor, start - w + 1, 0)
            past = torch.arange(lo, start, device=q.device)
            keys = torch.cat([ring[slot, past % ring_len].to(kv.dtype), kv[off : off + n]])
            kpos = torch.cat([past, lay.positions[off : off + n]])
            pos = lay.positions[off : off + n]
            qs = q[off : off + n]
            logit = torch.matmul(qs, keys.T) * scale  # [n, h, m]
            see = (kpos[None] <= pos[:, None]) & (kpos[None] > pos[:, None] - w)
            see &= kpos[None] >= floor
            logit = logit.masked_fill(~see[:, None], float("-inf"))
            parts, values = [logit], None
            if topk is not None and topk[s].shape[1]:
                main, _ = self._entries(batch, share, s)
                sel = topk[s]
                ent = main[sel.clamp(min=0)].to(qs.dtype)  # [n, k, hd] (FP4 pages: fp32)
                cl = torch.bmm(qs, ent.transpose(1, 2)) * scale  # [n, h, k]
                cl = cl.masked_fill((sel < 0)[:, None], float("-inf"))
                parts.append(cl)
                values = ent
            sink = self.attn_sink.to(logit.dtype).view(1, -1, 1).expand(n, -1, 1)
            probs = torch.softmax(torch.cat([*parts, sink], -1).float(), -1).to(qs.dtype)
            o = torch.matmul(probs[..., : keys.shape[0]], keys)  # [n, h, d]
            if values is not None:
                o = o + torch.bmm(probs[..., keys.shape[0] : -1], values)
            out[off : off + n] = o
            # The ring keeps each request's last ring_len window keys (read above first: a
            # long chunk overwrites slots its own first rows still needed).
            keep = range(max(start, start + n - ring_len), start + n)
            idx = torch.tensor(list(keep), device=q.device)
            ring[slot, idx % ring_len] = kv[off + idx - start].to(ring.dtype)
        return out

    def _attend_decode(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        topk: list[torch.Tensor] | None,
        batch: ForwardBatch,
        cache: LayerCache,
        share: StepShare,
    ) -> torch.Tensor:
        """_attend for a step of one row per request, every request at once: the same keys
        (the ring's last window - 1 positions and the row's own; the selected entries, read
        from the KV source's pages by their ids) and the same softmax."""
        lay, w, ring = batch.layout, self.window, cache.ring
        ring_len = ring.shape[1]
        scale = self.hd**-0.5
        pos, slots = lay.positions, lay.slots
        past = pos[:, None] + torch.arange(1 - w, 0, device=q.device)[None]  # [S, w - 1]
        ringk = ring[slots[:, None], past.clamp(min=0) % ring_len].to(kv.dtype)
        keys = torch.cat([ringk, kv[:, None]], 1)  # [S, w, d]
        logit = torch.bmm(q, keys.transpose(1, 2)) * scale  # [S, h, w]
        seen = torch.cat([past >= 0, torch.ones_like(past[:, :1], dtype=torch.bool)], 1)
        parts, ent = [logit.masked_fill(~seen[:, None], float("-inf"))], None
        if topk is not None and max(t.shape[1] for t in topk):
            width = max(t.shape[1] for t in topk)
            sel = torch.cat([F.pad(t, (0, width - t.shape[1]), value=-1) for t in topk])
            c, r = self.config, self.ratio
            epb = batch.block_size // r
            ids = sel.clamp(min=0)
            blocks = lay.block_tables.gather(1, ids * r // batch.block_size)
            pages = share.caches[c.kv_source(self.layer)].comp
            flat = (blocks * epb + ids % epb).view(-1)
            ent = share.codec.load_main(pages, flat).view(*sel.shape, -1).to(q.dtype)
            cl = torch.bmm(q, ent.transpose(1, 2)) * scale  # [S, h, k]
            parts.append(cl.masked_fill((sel < 0)[:, None], float("-inf")))
        sink = self.attn_sink.to(logit.dtype).view(1, -1, 1).expand(q.shape[0], -1, 1)
        probs = torch.softmax(torch.cat([*parts, sink], -1).float(), -1).to(q.dtype)
        out = torch.bmm(probs[..., :w], keys)
        if ent is not None:
            out = out + torch.bmm(probs[..., w:-1], ent)
        ring[slots, pos % ring_len] = kv.to(ring.dtype)
        return out
