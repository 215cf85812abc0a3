"""KV compressors (CSA / HCA) and the lightning indexer, writing into the serving caches.

A compressor projects every token to a value row and a gate row; each window of `ratio` tokens
pools into one entry: softmax over the window's gates (+ a learned per-offset bias), weighted sum
of the values, RMSNorm, RoPE at the window's first position. CSA windows overlap: projections
are twice as wide, and entry w pools the first half (Ca) of window w-1's rows together with the
second half (Cb) of window w's rows (entry 0 has no previous window). HCA windows do not
overlap. Rows of a window that is not complete yet wait in the request's tail state.
"""

from __future__ import annotations

import torch
from torch import nn

from deepring.cache.pool import LayerCache
from deepring.kernels.gather import take_rows
from deepring.kernels.indexer import indexer_topk
from deepring.kernels.rope import apply_rope, norm_rope
from deepring.model.batch import CompressPlan, ForwardBatch
from deepring.model.config import ModelConfig
from deepring.model.linear import linear
from deepring.model.norm import RMSNorm


def compress_into(
    batch: ForwardBatch,
    kv: torch.Tensor,
    gate: torch.Tensor,
    tail_kv: torch.Tensor,
    tail_gate: torch.Tensor,
    position_bias: torch.Tensor,
    norm: RMSNorm,
    out_cache: torch.Tensor,
    ratio: int,
    overlap: bool,
    edges: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Pool the windows this step completes into `out_cache`, then update the tail state (and,
    for an overlapping compressor, the block edges: see cache.pool)."""
    plan = batch.compress_plan(ratio, overlap)
    width = kv.shape[1]
    if batch.capture is not None:
        batch.capture.append((tail_kv, tail_gate, kv, gate))
    if edges is not None and (edge := batch.edge_plan(ratio)) is not None:
        half = width // 2  # the next entry pools only the first half of these rows
        for src, dst in zip((kv, gate), edges, strict=True):
            dst.view(-1, half)[edge.dest] = src[edge.rows, :half].to(dst.dtype)
    flat_kv = tail_kv.view(-1, width)
    flat_gate = tail_gate.view(-1, width)
    if batch.is_decode and kv.dtype == tail_kv.dtype:
        # One row per request: stored first, the rows of every window completed now are all
        # in the tail (the window ends at this row; the slot overwritten held the position
        # just before the window). One gather per tensor then also takes the right half of
        # an overlapping window's rows.
        flat_kv[plan.keep_dest] = kv
        flat_gate[plan.keep_dest] = gate
        if plan.entry_seq.numel():
            hd = out_cache.shape[-1]
            rows_kv = take_rows(tail_kv.view(-1, hd), plan.tail_row)
            bias = position_bias.view(ratio, -1, hd).transpose(0, 1).reshape(-1, hd)
            rows_gate = take_rows(tail_gate.view(-1, hd), plan.tail_row).float() + bias
            _pool(batch, plan, rows_kv, rows_gate, norm, out_cache, ratio, overlap)
        return
    if plan.entry_seq.numel():
        if plan.chunk_only:  # nothing to take from the tail state: one gather, not two
            rows_kv = take_rows(kv, plan.chunk_row).to(torch.promote_types(kv.dtype, flat_kv.dtype))
            rows_gate = take_rows(gate, plan.chunk_row).to(
                torch.promote_types(gate.dtype, flat_gate.dtype)
            )
        else:
            fc = plan.from_chunk[..., None]
            rows_kv = torch.where(
                fc, take_rows(kv, plan.chunk_row), take_rows(flat_kv, plan.state_row)
            )
            rows_gate = torch.where(
                fc, take_rows(gate, plan.chunk_row), take_rows(flat_gate, plan.state_row)
            )
        if overlap:
            hd = width // 2
            rows_kv = torch.cat([rows_kv[:, :ratio, :hd], rows_kv[:, ratio:, hd:]], 1)
            g = rows_gate.float()
            rows_gate = torch.cat(
                [
                    g[:, :ratio, :hd] + position_bias[:, :hd],
                    g[:, ratio:, hd:] + position_bias[:, hd:],
                ],
                1,
            )
        else:
            rows_gate = rows_gate.float() + position_bias
        _pool(batch, plan, rows_kv, rows_gate, norm, out_cache, ratio, overlap)
    flat_kv[plan.keep_dest] = kv[plan.keep_rows].to(flat_kv.dtype)
    flat_gate[plan.keep_dest] = gate[plan.keep_rows].to(flat_gate.dtype)


def _pool(
    batch: ForwardBatch,
    plan: CompressPlan,
    rows_kv: torch.Tensor,
    rows_gate: torch.Tensor,
    norm: RMSNorm,
    out_cache: torch.Tensor,
    ratio: int,
    overlap: bool,
) -> None:
    """Each entry's rows [E, R, hd] weighted by the softmax of their gates (fp32, position bias
    added) over the window, summed, normalised and rotated, into the paged cache."""
    if not plan.all_valid:
        rows_gate = rows_gate.masked_fill(~plan.valid[..., None], float("-inf"))
    weights = torch.softmax(rows_gate, dim=1).to(rows_kv.dtype)
    cis = batch.plan_rope(ratio, overlap)
    pooled = norm_rope((rows_kv * weights).sum(1), norm.weight, norm.eps, cis.real, cis.imag, cis)
    out_cache.view(-1, out_cache.shape[-1])[plan.dest] = pooled.to(out_cache.dtype)


class Indexer(nn.Module):
    """Scores compressed entries for each query and keeps the top `index_topk` (CSA only)."""

    def __init__(self, config: ModelConfig, ratio: int) -> None:
        super().__init__()
        d, self.hd, self.heads = config.hidden_size, config.index_head_dim, config.index_n_heads
        self.ratio, self.topk = ratio, config.index_topk
        self.kv_proj = linear(d, 2 * self.hd)
        self.gate_proj = linear(d, 2 * self.hd)
        self.position_bias = nn.Parameter(torch.zeros(ratio, 2 * self.hd, dtype=torch.float32))
        self.kv_norm = RMSNorm(self.hd, config.rms_norm_eps)
        self.q_b_proj = linear(config.q_lora_rank, self.heads * self.hd)
        self.scorer = nn.Module()
        self.scorer.weights_proj = linear(d, self.heads)

    def projections(self) -> list[nn.Linear]:
        """The layers applied to the attention input (fused with the attention's own)."""
        return [self.kv_proj, self.gate_proj, self.scorer.weights_proj]

    def query_projections(self) -> list[nn.Linear]:
        """The layers applied to the attention's q_lora (fused with its q_b_proj)."""
        return [self.q_b_proj]

    def forward(
        self,
        proj: tuple[torch.Tensor, ...],
        q_proj: tuple[torch.Tensor, ...],
        batch: ForwardBatch,
        cache: LayerCache,
    ) -> torch.Tensor:
        """proj, q_proj: this module's projections() applied to the attention input and its
        query_projections() to the attention's q_lora."""
        kv, gate, weights = proj
        compress_into(
            batch, kv, gate, cache.index_tail_kv, cache.index_tail_gate, self.position_bias,
            self.kv_norm, cache.index, self.ratio, overlap=True,
            edges=(cache.index_edge_kv, cache.index_edge_gate),
        )  # fmt: skip
        cos, sin = batch.cos_sin("compress")
        q = q_proj[0].view(-1, self.heads, self.hd)
        q = apply_rope(q, cos, sin, inplace=True, cis=batch.rope_cis("compress", False, 3))
        w = weights.float() * self.heads**-0.5
        return indexer_topk(q, w, cache.index, batch.layout, self.ratio, self.topk, self.hd**-0.5)


class Compressor(nn.Module):
    def __init__(self, config: ModelConfig, ratio: int, overlap: bool) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        width = 2 * hd if overlap else hd
        self.ratio, self.overlap = ratio, overlap
        self.kv_proj = linear(d, width)
        self.gate_proj = linear(d, width)
        self.position_bias = nn.Parameter(torch.zeros(ratio, width, dtype=torch.float32))
        self.kv_norm = RMSNorm(hd, config.rms_norm_eps)
        self.indexer = Indexer(config, ratio) if overlap else None

    def projections(self) -> list[nn.Linear]:
        """The layers applied to the attention input (fused with the attention's own)."""
        own = [self.kv_proj, self.gate_proj]
        return own + (self.indexer.projections() if self.indexer is not None else [])

    def query_projections(self) -> list[nn.Linear]:
        """The layers applied to the attention's q_lora (fused with its q_b_proj)."""
        return self.indexer.query_projections() if self.indexer is not None else []

    def forward(
        self,
        proj: tuple[torch.Tensor, ...],
        q_proj: tuple[torch.Tensor, ...],
        batch: ForwardBatch,
        cache: LayerCache,
    ) -> torch.Tensor | None:
        """Update the caches; return the CSA top-k entry ids per row (None for HCA).
        proj, q_proj: this module's projections() applied to the attention input and its
        query_projections() to the attention's q_lora."""
        compress_into(
            batch, proj[0], proj[1], cache.tail_kv, cache.tail_gate, self.position_bias,
            self.kv_norm, cache.comp, self.ratio, self.overlap,
            edges=(cache.edge_kv, cache.edge_gate) if self.overlap else None,
        )  # fmt: skip
        if self.indexer is None:
            return None
        return self.indexer(proj[2:], q_proj, batch, cache)
