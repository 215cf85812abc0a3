"""A model's expert-parallel state on one rank of a group: shards the routed experts of every
backbone MoE layer (ep.moe), keeps the load counters and the per-step load-balance record,
runs a rank's idle steps and the group's rebalancing.

Attention is data parallel: each rank runs its own requests with its own caches, and only the
MoE layers talk to the other ranks. Every rank must therefore run the same number of forward
passes: the group decides together whether to step (`step_together`), and a rank without
work joins with `idle_forward`, which enters every layer's collectives with no rows.

MTP / DSpark layers keep all their experts on every rank (a draft pass runs on one rank only,
so it cannot take part in collectives); speculative decoding under EP is not supported yet.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist
from torch import nn

from deepring.ep.moe import ExpertParallelMoE
from deepring.ep.placement import (
    ExpertLoad,
    Placement,
    balance_factor,
    balanced_placement,
    static_placement,
)


def rank_slots(n_experts: int, n_ranks: int, rank: int, n_redundant: int = 0) -> list[int]:
    """The experts a rank's slots hold before any load is known (the static placement every
    layer starts from): what it loads from the checkpoint."""
    return list(static_placement(n_experts, n_ranks, n_redundant).rank_experts(rank))


class ExpertParallel:
    def __init__(
        self,
        model: nn.Module,
        group: dist.ProcessGroup | None = None,
        n_redundant: int = 0,
        placements: list[Placement] | None = None,
        keep_loads: int | None = None,
        sharded: bool = False,
    ) -> None:
        """keep_loads: how many (step, layer) load rows `step_loads` keeps (None: all; a
        serving rank keeps a recent window, and `loads_seen` / `factor_sum` count them all).
        sharded: the model was loaded with only this rank's slots of the placements
        (model.loader.load_model(experts=rank_slots(...))); otherwise its whole experts are
        cut here."""
        config = model.config
        self.model = model
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        layers = model.model.layers
        if not all(hasattr(getattr(layer, "mlp", None), "ep") for layer in layers):
            raise ValueError("expert parallel runs DeepSeek V4 models (model.moe.MoE layers) only")
        n_experts = config.n_routed_experts
        if placements is None:
            placements = [static_placement(n_experts, self.size, n_redundant)] * len(layers)
        if len(placements) != len(layers):
            raise ValueError(f"{len(placements)} placements for {len(layers)} MoE layers")
        self.counters = ExpertLoad(len(layers), n_experts)
        # Tokens per rank, one entry per layer per step (the most recent keep_loads of them).
        self.step_loads: deque[list[int]] = deque(maxlen=keep_loads)
        self.loads_seen = 0  # (step, layer) rows with any tokens, since the start
        self.factor_sum = 0.0  # the sum of their max / mean
        self.layers: list[ExpertParallelMoE] = []
        for i, (layer, p) in enumerate(zip(layers, placements, strict=True)):
            ep = ExpertParallelMoE(i, p, group, self.counters, self._record)
            ex = layer.mlp.experts
            if sharded:
                for name, t in ex.slot_tensors().items():
                    if t.shape[0] != p.slots_per_rank:
                        raise ValueError(
                            f"layer {i} holds {t.shape[0]} expert slots in {name}, the "
                            f"placement gives this rank {p.slots_per_rank}"
                        )
            else:
                ex.keep_slots(p.rank_experts(self.rank))
            layer.mlp.ep = ep
            self.layers.append(ep)

    def _record(self, layer: int, rank_tokens: list[int]) -> None:
        self.step_loads.append(rank_tokens)
        if sum(rank_tokens):
            self.loads_seen += 1
            self.factor_sum += balance_factor([float(x) for x in rank_tokens])

    @property
    def placements(self) -> list[Placement]:
        return [ep.placement for ep in self.layers]

    def balance_factor(self) -> float:
        """Mean over the recorded (step, layer) pairs of max / mean tokens per rank."""
        pairs = [balance_factor([float(x) for x in row]) for row in self.step_loads if sum(row)]
        return sum(pairs) / len(pairs) if pairs else 1.0

    def step_together(self, has_work: bool) -> bool:
        """Collective: whether any rank of the group has work this step."""
        dev = self.layers[0].comm_device if self.layers else torch.device("cpu")
        flag = torch.tensor([1 if has_work else 0], dtype=torch.int64, device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())

    @torch.inference_mode()
    def idle_forward(self) -> None:
        """A step with no rows on this rank: join every MoE layer's collectives."""
        d = self.model.config.hidden_size
        x = torch.empty(0, d, dtype=self.model.dtype, device=self.model.device)
        ids = torch.empty(0, dtype=torch.long, device=self.model.device)
        for layer in self.model.model.layers:
            layer.mlp(x, ids)

    def rebalance(self) -> list[Placement]:
        """Collective, between steps: sum the routers' counters over the group, compute each
        layer's balanced placement (the same on every rank) and move the experts to it."""
        dev = self.layers[0].comm_device if self.layers else torch.device("cpu")
        counts = self.counters.take_window().to(dev)
        dist.all_reduce(counts, group=self.group)
        counts = counts.cpu()
        out = []
        for ep, layer, load in zip(self.layers, self.model.model.layers, counts, strict=True):
            new = balanced_placement(load.tolist(), self.size, ep.placement.n_redundant)
            if new != ep.placement:
                ex = layer.mlp.experts
                tensors = ex.slot_tensors()
                moved = ep.rearrange(new, *tensors.values())
                ex.set_slot_tensors(dict(zip(tensors, moved, strict=True)))
            out.append(new)
        return out

    def expert_bytes(self) -> int:
        """Bytes of routed-expert weights this rank holds."""
        return sum(
            t.numel() * t.element_size()
            for layer in self.model.model.layers
            for t in layer.mlp.experts.slot_tensors().values()
        )
