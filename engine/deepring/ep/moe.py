"""The expert-parallel MoE layer: each rank of a torch.distributed group holds a slice of the
routed experts' slots (ep.placement), the router, the shared expert and everything else stay
replicated, and every rank's tokens travel to the ranks holding their experts and back.

One layer, on a rank with local rows x [T, D] (T may be 0: a rank without work in a step still
joins every collective, or the others would wait forever):

1. route locally (the router is replicated): logical expert ids and weights [T, k];
2. pick a replica per (token, pick): the i-th pick of expert e on this rank goes to replica
   (i + rank) mod copies(e), an even split of a hot expert's tokens over its copies;
3. dispatch: the pick rows, ordered by destination rank, go out with one all_to_all_single
   (gloo supports it with uneven splits, NCCL too), their local slot ids with a second one;
   the split sizes come from an all_gather of every rank's per-destination counts, which is
   also the step's load matrix (rank loads = tokens each rank computes);
4. the receiving rank runs its slots' experts (kernels.moe.moe_experts: Triton on GPUs) with
   weight 1, and the outputs return along the reverse split;
5. combine at the origin: each pick's output times its routing weight, the k picks summed in
   pick order, plus the shared expert.

Rearrangement (`rearrange`) is a collective between steps: every rank computes the same
transfer plan from the old and new placements; an expert a rank gains is copied from its own
old slots when it had it, else sent by the lowest rank that held it, all in one
all_to_all_single of whole experts. The attention caches are untouched, so no request is lost.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from deepring.ep.placement import ExpertLoad, Placement
from deepring.kernels.moe import MoEWeights, route, routed_experts


class ExpertParallelMoE:
    """One MoE layer's expert-parallel state on one rank (installed as the layer's `ep`)."""

    def __init__(
        self,
        layer: int,
        placement: Placement,
        group: dist.ProcessGroup | None,
        counters: ExpertLoad | None = None,
        on_load: Callable[[int, list[int]], None] | None = None,
    ) -> None:
        self.layer = layer
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        if placement.n_ranks != self.size:
            raise ValueError(f"placement for {placement.n_ranks} ranks, group has {self.size}")
        self.counters = counters
        backend = dist.get_backend(group)
        self.comm_device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        self.on_load = on_load  # (layer, tokens per rank) after every dispatch
        self._set_placement(placement)

    def _set_placement(self, placement: Placement) -> None:
        self.placement = placement
        reps = placement.replicas()
        width = max(len(r) for r in reps)
        table = torch.full((placement.n_experts, width), -1, dtype=torch.long)
        for e, r in enumerate(reps):
            table[e, : len(r)] = torch.tensor(r)
        self._replicas = table
        self._copies = torch.tensor([len(r) for r in reps], dtype=torch.long)

    def _physical(self, idx: torch.Tensor) -> torch.Tensor:
        """Physical slot per (token, pick) [T, k]: an even round-robin over each expert's copies."""
        flat = idx.reshape(-1).cpu()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.placement.n_experts)
        starts = torch.cumsum(counts, 0) - counts
        occurrence = torch.empty_like(flat)
        occurrence[order] = torch.arange(flat.numel()) - starts[flat[order]]
        choice = (occurrence + self.rank) % self._copies[flat]
        return self._replicas[flat, choice].view(idx.shape)

    def _exchange(self, rows: torch.Tensor, out_splits: list[int], in_splits: list[int]):
        out = rows.new_empty((sum(out_splits), *rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=self.group)
        return out

    def __call__(
        self,
        x: torch.Tensor,
        input_ids: torch.Tensor,
        w: MoEWeights,
        shared: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        t, d = x.shape
        idx, wts = route(F.linear(x, w.router), input_ids, w)
        if self.counters is not None:
            self.counters.record(self.layer, idx)
        k = idx.shape[1]
        phys = self._physical(idx).reshape(-1)
        per_rank = self.placement.slots_per_rank
        order = torch.argsort(phys // per_rank, stable=True)
        send = torch.bincount(phys // per_rank, minlength=self.size)
        # NCCL only moves device tensors; gloo takes CPU ones (the counts live on the CPU).
        matrix = [torch.empty_like(send, device=self.comm_device) for _ in range(self.size)]
        dist.all_gather(matrix, send.to(self.comm_device), group=self.group)
        load = torch.stack(matrix).cpu()  # [src, dst] picks
        send_splits = send.tolist()
        recv_splits = load[:, self.rank].tolist()
        if self.on_load is not None:
            self.on_load(self.layer, load.sum(0).tolist())
        dev = x.device
        order_dev = order.to(dev)
        rows = x.index_select(0, order_dev // k)
        slots = (phys[order] % per_rank).to(dev)
        got = self._exchange(rows, recv_splits, send_splits)
        got_slots = self._exchange(slots, recv_splits, send_splits)
        if got.shape[0]:
            ones = torch.ones(got.shape[0], 1, dtype=torch.float32, device=dev)
            y = routed_experts(got, got_slots[:, None], ones, w)
        else:
            y = got
        back = self._exchange(y, send_splits, recv_splits)
        picks = torch.empty(t * k, d, dtype=x.dtype, device=dev)
        picks[order_dev] = back
        routed = (picks.view(t, k, d) * wts.to(x.dtype).unsqueeze(-1)).sum(1)
        return routed + shared(x)

    def rearrange(self, new: Placement, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Collective: this rank's slots under `new`, from its current ones and whole experts
        sent by the ranks that held them. tensors: the per-slot tensors ([S, ...] each, any
        dtype: gate_up / down, and for kept MXFP4 experts their packed bytes and scales), moved
        together as one row of bytes per slot, and returned in the same order."""
        old = self.placement
        if new.n_ranks != old.n_ranks or len(new.slot_expert) != len(old.slot_expert):
            raise ValueError("a rearrangement keeps the group size and the number of slots")
        per_rank = old.slots_per_rank
        holders = old.replicas()  # expert -> old physical slots
        # sends[src][dst]: the experts src sends dst, in dst's slot order
        sends: list[list[list[int]]] = [[[] for _ in range(self.size)] for _ in range(self.size)]
        for dst in range(self.size):
            had = set(old.rank_experts(dst))
            for e in new.rank_experts(dst):
                if e not in had:
                    sends[holders[e][0] // per_rank][dst].append(e)
        flat = torch.cat([_slot_bytes(t) for t in tensors], 1)
        old_slot = {e: s for s, e in enumerate(old.rank_experts(self.rank))}
        out_rows = [old_slot[e] for dst in range(self.size) for e in sends[self.rank][dst]]
        send_splits = [len(sends[self.rank][dst]) for dst in range(self.size)]
        recv_splits = [len(sends[src][self.rank]) for src in range(self.size)]
        rows = flat.index_select(0, torch.tensor(out_rows, dtype=torch.long, device=flat.device))
        got = self._exchange(rows, recv_splits, send_splits)
        received = {}
        at = 0
        for src in range(self.size):
            for e in sends[src][self.rank]:
                received[e] = at
                at += 1
        picked = [
            flat[old_slot[e]] if e in old_slot else got[received[e]]
            for e in new.rank_experts(self.rank)
        ]
        new_flat = torch.stack(picked)
        self._set_placement(new)
        out, at = [], 0
        for t in tensors:
            width = t[0].numel() * t.element_size()
            part = new_flat[:, at : at + width].contiguous().view(t.dtype)
            out.append(part.reshape(-1, *t.shape[1:]))
            at += width
        return tuple(out)


def _slot_bytes(t: torch.Tensor) -> torch.Tensor:
    """[S, ...] of any dtype as [S, bytes per slot] uint8 (a view of the same memory when t is
    contiguous), so tensors of different dtypes travel in one exchange."""
    return t.contiguous().view(t.shape[0], -1).view(torch.uint8)
