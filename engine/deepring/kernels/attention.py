"""V4 attention's entry point: attend over the sliding window and the compressed entries, and
remember this step's keys in the window ring. The model calls `window_attention`; which kernel
runs (Triton, numba, torch; a decode, prefill or mixed step) is decided here.

Why the ring write moves: a pure decode step on CPU writes the new keys into the ring first and
attends over the ring alone (one key group fewer); that is only safe when no row of the step
needs the positions it overwrites, so prefill and mixed steps (and the Triton decode kernel,
which reads the new key from `kv`) write the ring after attending.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from deepring.cache.pool import LayerCache
from deepring.kernels.attention_decode import DecodePlan, decode_attention, decode_plan
from deepring.kernels.attention_prefill import SeqLayout, prefill_attention
from deepring.kernels.dispatch import use_triton

T = TypeVar("T")


@dataclass(frozen=True)
class AttentionParams:
    """A layer's attention constants."""

    ratio: int  # tokens per compressed entry (0: window only)
    sinks: torch.Tensor  # [heads] fp32 sink logits
    scale: float
    window: int


class Step(Protocol):
    """What attention reads of the step (model.batch.ForwardBatch provides it)."""

    layout: SeqLayout
    decode_seqs: list[int]  # requests with one row this step
    prefill_seqs: list[int]

    @property
    def is_decode(self) -> bool: ...
    def cached(self, key: tuple, build: Callable[[], T]) -> T: ...
    def tail_rows(self, length: int) -> tuple[torch.Tensor | slice, torch.Tensor]: ...


def _decode_plan(step: Step, cache: LayerCache, p: AttentionParams, dense: bool, kv_in_ring: bool):
    """The step's decode plan for this layer's shape, built by the first layer that asks."""
    ring_len = cache.ring.shape[1]
    comp = cache.comp
    shape = (p.ratio, comp.shape[1]) if comp is not None and dense else None
    lay = step.layout

    def build() -> DecodePlan:
        return decode_plan(
            lay.positions, lay.slots, lay.block_tables, ring_len, p.window, shape, kv_in_ring
        )

    return step.cached(("decode", ring_len, p.window, shape, kv_in_ring), build)


def _attend(
    q: torch.Tensor,
    kv: torch.Tensor,
    cache: LayerCache,
    comp_idx: torch.Tensor | None,
    p: AttentionParams,
    step: Step,
    kv_in_ring: bool,
) -> torch.Tensor:
    lay = step.layout
    args = (p.ratio, p.sinks, p.scale, p.window)
    if step.is_decode:  # one row per request, in request order
        return decode_attention(
            q, kv, cache.ring, cache.comp, lay.positions, lay.slots, lay.block_tables,
            comp_idx, *args,
            plan=lambda: _decode_plan(step, cache, p, comp_idx is None, kv_in_ring),
            kv_in_ring=kv_in_ring,
        )  # fmt: skip
    if use_triton(q) or not step.decode_seqs:
        return prefill_attention(q, kv, cache.ring, cache.comp, lay, comp_idx, *args)
    # Mixed step on the torch path: batch the single-row requests, loop over the others.
    out = prefill_attention(
        q, kv, cache.ring, cache.comp, lay.subset(step.prefill_seqs), comp_idx, *args
    )
    ds = step.decode_seqs
    rows = lay.offsets_t[ds]
    out[rows] = decode_attention(
        q[rows], kv[rows], cache.ring, cache.comp, lay.positions[rows], lay.slots[ds],
        lay.block_tables[ds], None if comp_idx is None else comp_idx[rows], *args,
    )  # fmt: skip
    return out


def window_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    cache: LayerCache,
    comp_idx: torch.Tensor | None,
    params: AttentionParams,
    step: Step,
) -> torch.Tensor:
    """Attention output [T, heads, head_dim] of queries q [T, heads, head_dim] over each row's
    window (this step's keys kv [T, head_dim] and the ring) and its compressed entries (the
    CSA top-k `comp_idx`, or every causal HCA entry); this step's keys are written into the
    layer's window ring."""
    rows, dest = step.tail_rows(cache.ring.shape[1])
    ring = cache.ring.view(-1, cache.ring.shape[-1])
    early = step.is_decode and not use_triton(q)
    if early:
        ring[dest] = kv[rows].to(ring.dtype)
    out = _attend(q, kv, cache, comp_idx, params, step, early)
    if not early:
        ring[dest] = kv[rows].to(ring.dtype)
    return out
