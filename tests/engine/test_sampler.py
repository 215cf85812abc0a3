"""The sampler: greedy, filters, the (seed, position) randomness, batch invariance, and the
sampled distribution against the filtered softmax."""

from __future__ import annotations

import math

import pytest
import torch
from deepring.kernels.sampling import sample_torch
from deepring.sampling.params import SamplingParams
from deepring.sampling.sampler import Sampler, splitmix64, uniform


def _logits(b: int, v: int, seed: int) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 2


def test_splitmix64_known_values():
    # Reference values of SplitMix64 (Vigna) for state 0 and 1 after one step.
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(1) == 0x910A2DEC89025CC1


def test_uniform_is_a_function_of_seed_and_position():
    assert uniform(7, 100) == uniform(7, 100)
    us = [uniform(7, p) for p in range(2000)]
    assert all(0.0 <= u < 1.0 for u in us)
    assert abs(sum(us) / len(us) - 0.5) < 0.03
    assert uniform(7, 100) != uniform(8, 100)


def test_greedy_is_first_argmax():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 5.0]])
    out = Sampler()(logits, [SamplingParams(temperature=0)] * 2, [0, 0], [1, 1])
    assert out == [1, 0]


def test_batch_invariance_and_order_independence():
    v = 300
    logits = _logits(12, v, 0)
    params = [
        SamplingParams(temperature=t, top_p=p, top_k=k, seed=s)
        for t, p, k, s in [
            (1.0, 1.0, -1, 1), (0.7, 0.9, -1, 2), (1.3, 1.0, 20, 3), (0.0, 1.0, -1, 4),
            (0.9, 0.5, 50, 5), (2.0, 0.99, 5, 6), (1.0, 0.3, -1, 7), (0.5, 1.0, 1, 8),
            (1.0, 1.0, -1, 9), (0.8, 0.8, 100, 10), (1.1, 0.95, 3, 11), (1.0, 0.7, 40, 12),
        ]
    ]  # fmt: skip
    seeds = [p.seed for p in params]
    positions = list(range(40, 52))
    s = Sampler()
    together = s(logits, params, seeds, positions)
    alone = [s(logits[i : i + 1], [params[i]], [seeds[i]], [positions[i]])[0] for i in range(12)]
    assert together == alone
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1)).tolist()
    shuffled = s(
        logits[perm],
        [params[i] for i in perm],
        [seeds[i] for i in perm],
        [positions[i] for i in perm],
    )
    assert shuffled == [together[i] for i in perm]


def _filtered_probs(logits: torch.Tensor, t: float, top_p: float, top_k: int) -> torch.Tensor:
    """An independent statement of the filters: sort, cut, renormalise."""
    lg = logits / t
    order = torch.argsort(lg, descending=True)
    keep = torch.zeros_like(lg, dtype=torch.bool)
    k = len(lg) if top_k <= 0 else top_k
    keep[order[:k]] = True
    kth = lg[order[k - 1]]
    keep |= lg == kth  # ties at the k-th value stay
    p = torch.softmax(torch.where(keep, lg, float("-inf")), -1)
    if top_p < 1:
        mass_above = torch.stack([(p[p > p[i]]).sum() for i in range(len(p))])
        p = torch.where(mass_above < top_p, p, 0.0)
    return p / p.sum()


@pytest.mark.parametrize(
    ("t", "top_p", "top_k"), [(1.0, 1.0, -1), (0.7, 0.8, -1), (1.5, 1.0, 6), (1.0, 0.6, 10)]
)
def test_sampled_distribution_matches_filtered_softmax(t, top_p, top_k):
    v = 24
    logits = _logits(1, v, 3)[0]
    n = 6000
    params = SamplingParams(temperature=t, top_p=top_p, top_k=top_k, seed=11)
    toks = Sampler()(logits.expand(n, v), [params] * n, [11] * n, list(range(n)))
    freq = torch.bincount(torch.tensor(toks), minlength=v).double() / n
    want = _filtered_probs(logits, t, top_p, top_k).double()
    assert torch.all(freq[want == 0] == 0), "a filtered-out token was sampled"
    # Each frequency within 5 standard errors of its probability.
    se = torch.sqrt(want * (1 - want) / n) + 1e-9
    assert torch.all((freq - want).abs() <= 5 * se + 1e-3)


def test_top_k_one_is_greedy():
    logits = _logits(4, 50, 4)
    out = Sampler()(logits, [SamplingParams(top_k=1, seed=1)] * 4, [1] * 4, [5] * 4)
    assert out == logits.argmax(-1).tolist()


def test_tiny_top_p_is_greedy():
    logits = _logits(4, 50, 5)
    out = Sampler()(logits, [SamplingParams(top_p=1e-6, seed=1)] * 4, [1] * 4, [5] * 4)
    assert out == logits.argmax(-1).tolist()


def test_inverse_cdf_boundaries():
    logits = torch.log(torch.tensor([[0.25, 0.0, 0.25, 0.5]]))
    temp, one = torch.ones(1), torch.ones(1)
    k = torch.full((1,), -1)
    for u, want in [(0.0, 0), (0.2499, 0), (0.25, 2), (0.4999, 2), (0.5, 3), (0.9999, 3)]:
        assert sample_torch(logits, temp, one, k, torch.tensor([u], dtype=torch.float64)) == want


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"seed": -1},
        {"stop_token_ids": (-3,)},
        {"top_k": 2.5},
        {"temperature": math.nan},
    ],
)
def test_sampling_params_validation(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)
