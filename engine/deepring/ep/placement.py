"""The expert load balancer: per-expert load counters, redundant expert slots, and a placement
of the slots on the ranks of an expert-parallel group that keeps the busiest rank's load low.

A placement gives every rank the same number of physical slots, S = (E + K) / N for E routed
experts, K redundant slots and N ranks. Every expert has at least one slot; a hot expert may
have several (replicas), and the tokens routed to it are split evenly among them. The load of a
rank is the sum of its slots' shares; the balance factor is max / mean rank load (1.0 is
perfect; DeepSeek reports 1.090 for decode).

How the placement is chosen (the structure of DeepSeek's EPLB, written from its description):

1. Replica counts: the K spare slots go one at a time to the expert whose per-replica load is
   the highest. This minimises the largest per-replica load, which bounds the max rank load
   from below.
2. Packing: replicas in decreasing load order, each to the least-loaded rank that has a free
   slot and does not hold that expert yet (a second copy on the same rank would not split its
   load) -- longest-processing-time-first.
3. Refinement: swaps of one slot of the busiest rank with one slot of another rank, while a
   swap lowers the pair's larger load (LPT alone is up to 4/3 off the optimum; the swaps close
   most of the gap on the skewed loads that matter).

Every rank computes the placement from the same all-reduced counters with this deterministic
code, so the group agrees on it without sending it around.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    """Which logical expert each physical slot holds: slot p = rank * slots_per_rank + s."""

    slot_expert: tuple[int, ...]  # [N * S] logical expert id of every physical slot
    n_ranks: int
    n_experts: int

    def __post_init__(self) -> None:
        n_slots = len(self.slot_expert)
        if self.n_ranks < 1 or n_slots % self.n_ranks:
            raise ValueError(f"{n_slots} slots do not split evenly over {self.n_ranks} ranks")
        missing = set(range(self.n_experts)) - set(self.slot_expert)
        if missing:
            raise ValueError(f"experts {sorted(missing)[:8]} have no slot")
        if any(not 0 <= e < self.n_experts for e in self.slot_expert):
            raise ValueError(f"slot expert ids must lie in [0, {self.n_experts})")

    @property
    def slots_per_rank(self) -> int:
        return len(self.slot_expert) // self.n_ranks

    @property
    def n_redundant(self) -> int:
        return len(self.slot_expert) - self.n_experts

    def rank_experts(self, rank: int) -> tuple[int, ...]:
        s = self.slots_per_rank
        return self.slot_expert[rank * s : (rank + 1) * s]

    def replicas(self) -> list[list[int]]:
        """Per logical expert, its physical slots in increasing order."""
        out: list[list[int]] = [[] for _ in range(self.n_experts)]
        for p, e in enumerate(self.slot_expert):
            out[e].append(p)
        return out

    def rank_loads(self, expert_load: list[float] | torch.Tensor) -> list[float]:
        """Each rank's load when every expert's load is split evenly among its replicas."""
        load = [float(x) for x in expert_load]
        copies = [len(r) for r in self.replicas()]
        s = self.slots_per_rank
        return [
            sum(load[e] / copies[e] for e in self.slot_expert[r * s : (r + 1) * s])
            for r in range(self.n_ranks)
        ]


def balance_factor(rank_loads: list[float]) -> float:
    """max / mean rank load (1.0 when there is no load at all)."""
    total = sum(rank_loads)
    if total <= 0:
        return 1.0
    return max(rank_loads) * len(rank_loads) / total


def check_layout(n_experts: int, n_ranks: int, n_redundant: int) -> int:
    """Slots per rank for this layout, or a clear error when it does not exist."""
    if n_ranks < 1 or n_redundant < 0:
        raise ValueError(f"need at least one rank and K >= 0, got N={n_ranks}, K={n_redundant}")
    if (n_experts + n_redundant) % n_ranks:
        raise ValueError(
            f"{n_experts} experts + {n_redundant} redundant slots do not split evenly over "
            f"{n_ranks} ranks (E + K must be a multiple of N)"
        )
    if n_redundant > n_experts * (n_ranks - 1):
        raise ValueError(f"{n_redundant} redundant slots exceed one copy per expert per rank")
    return (n_experts + n_redundant) // n_ranks


def static_placement(n_experts: int, n_ranks: int, n_redundant: int = 0) -> Placement:
    """The placement before any load is known: experts in order, spare slots round-robin."""
    check_layout(n_experts, n_ranks, n_redundant)
    return balanced_placement([1.0] * n_experts, n_ranks, n_redundant)


def replica_counts(load: list[float], n_redundant: int, max_copies: int) -> list[int]:
    """Step 1: one slot per expert, then each spare slot to the highest per-replica load."""
    counts = [1] * len(load)
    for _ in range(n_redundant):
        best = max(
            (e for e in range(len(load)) if counts[e] < max_copies),
            key=lambda e: (load[e] / counts[e], -e),
        )
        counts[best] += 1
    return counts


def balanced_placement(
    expert_load: list[float] | torch.Tensor, n_ranks: int, n_redundant: int = 0
) -> Placement:
    """A placement of E experts plus `n_redundant` replicas on `n_ranks` ranks that keeps the
    max rank load low (steps 1-3 of the module docstring).

    Spare slots also work as filler: the greedy replica counts can leave a packing that
    balances worse than one where the last spare or two went to a smaller expert (its halves
    fill the gaps). So the last `m` spares are also tried on each of the hottest experts, and
    the best packing wins (m = 2 for few experts, 1 otherwise; a bounded search)."""
    load = [max(float(x), 0.0) for x in expert_load]
    n_experts = len(load)
    per_rank = check_layout(n_experts, n_ranks, n_redundant)
    best: tuple[float, list[list[tuple[float, int]]]] | None = None
    for counts in _candidate_counts(load, n_redundant, n_ranks):
        ranks = _pack(load, counts, n_ranks, per_rank)
        worst = max(sum(s for s, _ in r) for r in ranks)
        if best is None or worst < best[0] - 1e-9:
            best = (worst, ranks)
    assert best is not None  # _candidate_counts yields at least the greedy counts
    slots = [e for r in best[1] for _, e in sorted(r, key=lambda t: t[1])]
    return Placement(tuple(slots), n_ranks, n_experts)


def _candidate_counts(load: list[float], n_redundant: int, max_copies: int) -> list[list[int]]:
    """The greedy replica counts, then variants whose last m spares went elsewhere."""
    m = min(n_redundant, 2 if len(load) <= 16 else 1)
    base = replica_counts(load, n_redundant - m, max_copies)
    hot = sorted(range(len(load)), key=lambda e: (-load[e] / base[e], e))[:8]
    out = [replica_counts(load, n_redundant, max_copies)]
    for extra in itertools.combinations_with_replacement(hot, m):
        counts = list(base)
        for e in extra:
            counts[e] += 1
        if max(counts) <= max_copies and counts not in out:
            out.append(counts)
    return out


def _pack(
    load: list[float], counts: list[int], n_ranks: int, per_rank: int
) -> list[list[tuple[float, int]]]:
    """Steps 2 and 3 for given replica counts: each rank's (share, expert) slots."""
    # LPT. Ties broken by expert id and rank id, so every rank computes the same result.
    items = sorted(
        ((load[e] / counts[e], e) for e in range(len(load)) for _ in range(counts[e])),
        key=lambda t: (-t[0], t[1]),
    )
    ranks: list[list[tuple[float, int]]] = [[] for _ in range(n_ranks)]
    totals = [0.0] * n_ranks
    for share, e in items:
        free = [
            r
            for r in range(n_ranks)
            if len(ranks[r]) < per_rank and all(x != e for _, x in ranks[r])
        ]
        if not free:  # only a duplicate-free rank was full: accept a second copy on one rank
            free = [r for r in range(n_ranks) if len(ranks[r]) < per_rank]
        r = min(free, key=lambda r: (totals[r], r))
        ranks[r].append((share, e))
        totals[r] += share
    _refine(ranks, totals)
    return ranks


def _refine(ranks: list[list[tuple[float, int]]], totals: list[float], rounds: int = 64) -> None:
    """Step 3: swap one slot of the busiest rank with one of another rank while that lowers
    the larger of the two loads (bounded rounds: each accepted swap strictly lowers it)."""
    for _ in range(rounds):
        hi = max(range(len(ranks)), key=lambda r: (totals[r], -r))
        best = None  # (new pair max, other rank, index on hi, index on other)
        for lo in range(len(ranks)):
            if lo == hi:
                continue
            for i, (a, ea) in enumerate(ranks[hi]):
                for j, (b, eb) in enumerate(ranks[lo]):
                    if a <= b or ea == eb:
                        continue
                    if any(e == ea for _, e in ranks[lo]) or any(e == eb for _, e in ranks[hi]):
                        continue  # would put two copies of an expert on one rank
                    new_max = max(totals[hi] - a + b, totals[lo] - b + a)
                    if new_max < totals[hi] - 1e-12 and (best is None or new_max < best[0]):
                        best = (new_max, lo, i, j)
        if best is None:
            return
        _, lo, i, j = best
        a, b = ranks[hi][i], ranks[lo][j]
        ranks[hi][i], ranks[lo][j] = b, a
        totals[hi] += b[0] - a[0]
        totals[lo] += a[0] - b[0]


class ExpertLoad:
    """Per-layer, per-expert token counters fed by the router (every (token, pick) counts one).

    `decay` < 1 keeps an exponential moving window: each `take_window` multiplies what is
    kept by it, so a placement follows the load as it shifts instead of the whole history.
    """

    def __init__(self, n_layers: int, n_experts: int, decay: float = 0.5) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must lie in [0, 1], got {decay}")
        self.decay = decay
        self.counts = torch.zeros(n_layers, n_experts, dtype=torch.float64)

    def record(self, layer: int, expert_ids: torch.Tensor) -> None:
        if expert_ids.numel():
            ids = expert_ids.reshape(-1).to("cpu", torch.long)
            self.counts[layer] += torch.bincount(ids, minlength=self.counts.shape[1]).double()

    def take_window(self) -> torch.Tensor:
        """The counters now (a copy), then decayed for the next window."""
        out = self.counts.clone()
        self.counts *= self.decay
        return out
