"""The expert load balancer (deepring.ep.placement) against a brute-force optimum on small
cases, and its bookkeeping: slot layout, replica split, counters, clear errors."""

from __future__ import annotations

import functools
import itertools
import random

import pytest
import torch
from deepring.ep.placement import (
    ExpertLoad,
    Placement,
    balance_factor,
    balanced_placement,
    static_placement,
)


def _brute_force_max_load(load: list[float], n_ranks: int, n_redundant: int) -> float:
    """The smallest possible max rank load over every placement: every vector of replica
    counts, then every way of filling the ranks' slots with those replicas, each rank holding
    distinct experts (a second copy on the same rank would not split the expert's load between
    ranks: it is a wasted slot, which the balancer does not consider)."""
    n = len(load)
    per_rank = (n + n_redundant) // n_ranks
    best = float("inf")
    for extra in itertools.product(range(n_ranks), repeat=n):
        if sum(extra) != n_redundant:
            continue
        counts = [1 + x for x in extra]
        share = [load[e] / counts[e] for e in range(n)]

        @functools.cache
        def fill(remaining: tuple[int, ...], ranks_left: int, share=share) -> float:
            if ranks_left == 0:
                return 0.0
            out = float("inf")
            present = [e for e in range(n) if remaining[e]]
            for combo in itertools.combinations(present, per_rank):
                rest = list(remaining)
                for e in combo:
                    rest[e] -= 1
                here = sum(share[e] for e in combo)
                out = min(out, max(here, fill(tuple(rest), ranks_left - 1)))
            return out

        best = min(best, fill(tuple(counts), n_ranks))
    return best


def _skewed(rng: random.Random, n: int) -> list[float]:
    """A Zipf-like load with a random order: a few hot experts, a long cold tail."""
    loads = [1000.0 / (i + 1) ** rng.uniform(0.8, 1.6) for i in range(n)]
    rng.shuffle(loads)
    return [float(round(x)) for x in loads]


CASES = [  # (experts, ranks, redundant)
    (4, 2, 0),
    (6, 2, 0),
    (6, 2, 2),
    (6, 3, 0),
    (6, 3, 3),
    (4, 4, 4),
    (8, 2, 2),
    (5, 3, 1),
]


@pytest.mark.parametrize(("n_experts", "n_ranks", "n_redundant"), CASES)
def test_placement_within_two_percent_of_brute_force(n_experts, n_ranks, n_redundant):
    rng = random.Random(n_experts * 100 + n_ranks * 10 + n_redundant)
    for _ in range(6):
        load = _skewed(rng, n_experts)
        p = balanced_placement(load, n_ranks, n_redundant)
        ours = max(p.rank_loads(load))
        optimum = _brute_force_max_load(load, n_ranks, n_redundant)
        assert ours <= optimum * 1.02 + 1e-9, (load, p.slot_expert, ours, optimum)


def test_redundancy_brings_a_skewed_load_near_balance():
    rng = random.Random(7)
    load = _skewed(rng, 64)
    without = balance_factor(balanced_placement(load, 8, 0).rank_loads(load))
    with_spares = balance_factor(balanced_placement(load, 8, 16).rank_loads(load))
    assert with_spares < without
    assert with_spares <= 1.10


def test_placement_layout_and_replicas():
    load = [100.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    p = balanced_placement(load, 2, 2)
    assert p.slots_per_rank == 4
    assert p.n_redundant == 2
    reps = p.replicas()
    # The hot expert gets a copy on each rank (no more: a second copy on one rank would not
    # split its load); the other spare goes to the next-hottest per-replica load.
    assert len(reps[0]) == 2
    assert {q // 4 for q in reps[0]} == {0, 1}
    assert sorted(p.slot_expert) == [0, 0, 1, 1, 2, 3, 4, 5]
    assert sum(p.rank_loads(load)) == pytest.approx(sum(load))
    assert set(p.rank_experts(0)) | set(p.rank_experts(1)) == set(range(6))


def test_static_placement_and_determinism():
    p = static_placement(8, 4)
    assert p.slot_expert == (0, 4, 1, 5, 2, 6, 3, 7)
    load = [5.0, 3.0, 3.0, 9.0, 1.0, 1.0, 7.0, 2.0]
    assert balanced_placement(load, 4, 4) == balanced_placement(list(load), 4, 4)


@pytest.mark.parametrize(
    ("args", "match"),
    [((6, 4, 0), "multiple of N"), ((4, 2, 6), "exceed one copy"), ((4, 0, 0), "at least one")],
)
def test_impossible_layouts_are_clear_errors(args, match):
    with pytest.raises(ValueError, match=match):
        static_placement(*args)


def test_placement_validation():
    with pytest.raises(ValueError, match="have no slot"):
        Placement((0, 0, 1, 1), 2, 3)
    with pytest.raises(ValueError, match="split evenly"):
        Placement((0, 1, 2), 2, 3)


def test_expert_load_counters_decay():
    c = ExpertLoad(n_layers=2, n_experts=4, decay=0.5)
    c.record(0, torch.tensor([[0, 1], [1, 3]]))
    c.record(1, torch.tensor([2, 2, 2]))
    w = c.take_window()
    assert w[0].tolist() == [1.0, 2.0, 0.0, 1.0]
    assert w[1].tolist() == [0.0, 0.0, 3.0, 0.0]
    c.record(0, torch.tensor([0]))
    assert c.take_window()[0].tolist() == [1.5, 1.0, 0.0, 0.5]
