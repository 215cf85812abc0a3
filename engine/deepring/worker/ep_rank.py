"""A serving worker as one rank of an expert-parallel group (`deepring serve --ep N`).

Every rank is a whole worker to the frontend (its own requests, caches and load reports:
attention is data parallel), and its model's routed experts are spread over the group
(ep.group.ExpertParallel). The MoE layers' collectives need every rank to run the same number
of forward passes, so the worker loop calls `tick` on every iteration, whether or not it has
work: one all-reduce decides whether the group steps; a rank with work runs its engine step,
and a rank whose step ran no forward (no work, or only admissions) joins the layers'
collectives with zero rows. Every `rebalance_interval` group steps, between two steps, the
group rearranges its experts from the load it routed; the caches are untouched, so no request
is dropped.

A rank whose peer is gone fails in its next collective (gloo sees the closed connection; a
hung peer hits the group timeout): `tick` raises GroupLost, the worker exits, and the
supervisor restarts the whole group (launcher.py).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch
import torch.distributed as dist

from deepring.config import EngineSpec, EPConfig
from deepring.ep.group import ExpertParallel, rank_slots

log = logging.getLogger("deepring.worker")

# How long a collective waits for the other ranks before the group counts as broken: a long
# prefill step of a peer must fit (the peers wait in the step's all-reduce meanwhile).
GROUP_TIMEOUT_S = 120.0
# The worker loop's longest wait for messages between ticks: an idle rank's next tick is a
# collective the others wait in, so this bounds the latency a new request sees.
TICK_POLL_S = 0.005
# Load rows (step x layer) the balance record keeps for the recent balance factor.
KEEP_LOADS = 4096


def load_rank(spec: EngineSpec, config: EPConfig):
    """The model with only this rank's routed experts (the static placement's slots), read
    from the checkpoint: a rank holds (E + K) / N of the experts plus the replicated rest from
    the start, never the whole model (core.build.load_weights)."""
    from deepring.core.build import load_weights
    from deepring.model.config import ModelConfig
    from deepring.model.loader import resolve_model_path

    if spec.zero_cost:
        raise ValueError("expert parallel needs a model (not the zero-cost runner)")
    n_experts = ModelConfig.from_pretrained(resolve_model_path(spec.model)).n_routed_experts
    slots = rank_slots(n_experts, config.size, config.rank, config.redundant)
    return load_weights(spec, experts=slots)


class GroupLost(RuntimeError):
    """A collective failed: another rank of the group is gone or stuck."""


class EPRank:
    def __init__(self, config: EPConfig, model: torch.nn.Module) -> None:
        """model: loaded by load_rank (its experts are this rank's slots already)."""
        device = model.device
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=config.init_addr,
            rank=config.rank,
            world_size=config.size,
            timeout=timedelta(seconds=GROUP_TIMEOUT_S),
        )
        self.config = config
        self.ep = ExpertParallel(
            model, n_redundant=config.redundant, keep_loads=KEEP_LOADS, sharded=True
        )
        self.group_steps = 0  # steps the group ran together (the same count on every rank)
        self.rebalances = 0
        self.group_busy = False  # whether any rank had work at the last tick
        log.info(
            "rank %d of expert-parallel group %d (%d ranks, %s): %d expert slots per layer, "
            "%.1f MiB of routed experts here",
            config.rank, config.group, config.size, backend,
            self.ep.layers[0].placement.slots_per_rank, self.ep.expert_bytes() / 2**20,
        )  # fmt: skip

    def tick(self, role) -> bool:
        """One lockstep iteration for this rank's role (worker.roles): whether the group
        stepped. Collective: every rank of the group calls it once per loop iteration."""
        engine = role.engine
        mine = role.busy
        try:
            self.group_busy = self.ep.step_together(mine)
            if not self.group_busy:
                return False
            before = engine.num_steps
            if mine:
                role.step()
            if engine.num_steps == before:  # no forward here: join the others' with no rows
                self.ep.idle_forward()
            self.group_steps += 1
            interval = self.config.rebalance_interval
            if interval and self.group_steps % interval == 0:
                self.ep.rebalance()
                self.rebalances += 1
        except (RuntimeError, dist.DistError) as e:
            # Only the collectives fail this way in a step of a healthy engine; a peer's exit
            # is what the group cannot survive.
            if isinstance(e, GroupLost) or not _is_collective_error(e):
                raise
            raise GroupLost(f"expert-parallel group {self.config.group} lost a rank: {e}") from e
        return True

    def report(self) -> dict:
        """The group's load balance as this rank saw it (Stats.expert_parallel)."""
        ep = self.ep
        return {
            "group": self.config.group,
            "rank": self.config.rank,
            "ranks": self.config.size,
            "slots": ep.layers[0].placement.slots_per_rank if ep.layers else 0,
            "redundant": self.config.redundant,
            "group_steps": self.group_steps,
            "rebalances": self.rebalances,
            "balance_rows": ep.loads_seen,
            # max / mean tokens per rank over (step, layer): the mean of the recent window,
            # and the sum since the start (sum / rows: the mean since the start).
            "balance_factor": ep.balance_factor(),
            "balance_factor_sum": ep.factor_sum,
        }

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _is_collective_error(e: BaseException) -> bool:
    """Whether `e` came out of torch.distributed (gloo / NCCL): a broken connection, a
    timeout, an aborted communicator."""
    if isinstance(e, dist.DistError):
        return True
    text = str(e).lower()
    return any(w in text for w in ("gloo", "nccl", "connection", "timed out", "timeout", "peer"))
