"""The sampler: greedy, filters, the (seed, position) randomness, batch invariance, the sampled
distribution against the filtered softmax, penalties, min_p and log probabilities."""

from __future__ import annotations

import math

import pytest
import torch
from deepring.kernels.sampling import sample_torch
from deepring.sampling.params import SamplingParams
from deepring.sampling.penalties import OutputCounts
from deepring.sampling.sampler import Sampler, SampleRow, splitmix64, uniform


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


# ---- penalties, min_p, logprobs --------------------------------------------------------------


def _rows(params, outputs, positions=None):
    positions = positions or [50 + i for i in range(len(params))]
    return [
        SampleRow(p, p.seed or 0, pos, list(out))
        for p, out, pos in zip(params, outputs, positions, strict=True)
    ]


def _penalized(logits, params, outputs):
    """OpenAI's definition, stated independently: per row, logit - freq * count - pres * seen."""
    out = logits.clone()
    for i, (p, o) in enumerate(zip(params, outputs, strict=True)):
        c = torch.bincount(torch.tensor(o, dtype=torch.long), minlength=logits.shape[1]).float()
        out[i] -= p.frequency_penalty * c + p.presence_penalty * (c > 0).float()
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_penalties_sample_as_the_penalised_logits_would(temperature):
    v = 64
    logits = _logits(6, v, 7)
    outputs = [[], [3, 3, 3, 9], [int(logits[2].argmax())] * 2, [1, 2, 3], [5] * 7, [60, 61]]
    params = [
        SamplingParams(temperature=temperature, seed=i, presence_penalty=pp, frequency_penalty=fp)
        for i, (pp, fp) in enumerate([(0, 0), (0.5, 1), (2, 2), (-1, 0), (0, -2), (1.5, -0.5)])
    ]
    got = Sampler().sample(logits, _rows(params, outputs)).tokens
    plain = [SamplingParams(temperature=temperature, seed=p.seed) for p in params]
    want = Sampler().sample(_penalized(logits, params, outputs), _rows(plain, outputs)).tokens
    assert got == want
    if temperature == 0:
        assert got[2] != int(logits[2].argmax())  # the repeated argmax was pushed down


def test_output_counts_kept_incrementally_equal_a_recount():
    counts = OutputCounts()
    v = 50
    gen = torch.Generator().manual_seed(3)
    live = [SampleRow(SamplingParams(), 0, 0, []) for _ in range(6)]
    for step in range(40):
        # Requests come and go (their rows are reused), grow by one token, or are recounted
        # from a shorter output (a resumed or recomputed request).
        if step % 7 == 3:
            live[step % 6] = SampleRow(SamplingParams(), 0, 0, [1, 2, 2])
        for r in live:
            r.output_ids.append(int(torch.randint(v, (1,), generator=gen)))
        if step % 11 == 5:
            del live[0].output_ids[-3:]
        batch = [r for i, r in enumerate(live) if (i + step) % 3]
        got = counts.gather(batch, [r.output_ids for r in batch], v, torch.device("cpu"))
        for row, r in zip(got, batch, strict=True):
            assert row.tolist() == torch.bincount(torch.tensor(r.output_ids), minlength=v).tolist()
    assert counts.table.shape[0] <= 8  # rows are reused: no more than one step's batch, doubled


def _min_p_probs(logits, t, min_p):
    p = torch.softmax(logits / t, -1)
    p = torch.where(p >= min_p * p.max(), p, 0.0)
    return p / p.sum()


@pytest.mark.parametrize(("t", "min_p"), [(1.0, 0.1), (0.5, 0.3), (2.0, 0.05)])
def test_min_p_distribution(t, min_p):
    v, n = 24, 6000
    logits = _logits(1, v, 8)[0]
    p = SamplingParams(temperature=t, min_p=min_p, seed=2)
    toks = Sampler()(logits.expand(n, v), [p] * n, [2] * n, list(range(n)))
    freq = torch.bincount(torch.tensor(toks), minlength=v).double() / n
    want = _min_p_probs(logits, t, min_p).double()
    assert torch.all(freq[want == 0] == 0), "a token below min_p was sampled"
    se = torch.sqrt(want * (1 - want) / n) + 1e-9
    assert torch.all((freq - want).abs() <= 5 * se + 1e-3)


def test_logprobs_report_the_penalised_tempered_distribution():
    v = 40
    logits = _logits(3, v, 9)
    outputs = [[4, 4], [], [7]]
    params = [
        SamplingParams(temperature=0, logprobs=5, frequency_penalty=1.0),
        SamplingParams(temperature=0.6, top_k=3, min_p=0.2, seed=1, logprobs=3),
        SamplingParams(temperature=1.3, top_p=0.5, seed=2, logprobs=0, presence_penalty=2),
    ]
    out = Sampler().sample(logits, _rows(params, outputs))
    ref = torch.log_softmax(
        _penalized(logits, params, outputs) / torch.tensor([1.0, 0.6, 1.3])[:, None], -1
    )
    for i, (tok, (lp, top)) in enumerate(zip(out.tokens, out.logprobs, strict=True)):
        assert lp == pytest.approx(float(ref[i, tok]), abs=1e-5)
        want = torch.topk(ref[i], params[i].logprobs)
        assert [t for t, _ in top] == want.indices.tolist()
        assert [x for _, x in top] == pytest.approx(want.values.tolist(), abs=1e-5)


def test_rows_without_logprobs_report_none_and_greedy_alone_keeps_its_fast_path():
    logits = _logits(2, 30, 10)
    rows = _rows([SamplingParams(temperature=0)] * 2, [[1], [2]])
    out = Sampler().sample(logits, rows)
    assert out.logprobs == [None, None]
    assert out.tokens == logits.argmax(-1).tolist()
    assert SamplingParams(temperature=0).argmax_only
    assert not SamplingParams(temperature=0, logprobs=0).argmax_only
    assert not SamplingParams(temperature=0, presence_penalty=0.1).argmax_only


def test_batch_invariance_with_penalties_min_p_and_logprobs():
    v = 200
    logits = _logits(8, v, 11)
    params = [
        SamplingParams(temperature=t, top_k=k, min_p=m, seed=s, logprobs=lp,
                       presence_penalty=pp, frequency_penalty=fp)
        for t, k, m, s, lp, pp, fp in [
            (0.0, -1, 0.0, 1, None, 0.0, 0.0), (0.9, 20, 0.05, 2, 3, 0.5, 0.5),
            (1.2, -1, 0.2, 3, None, 0.0, 1.0), (0.0, -1, 0.0, 4, 2, 1.0, 0.0),
            (0.7, 5, 0.0, 5, 0, -0.5, 0.3), (1.0, -1, 0.1, 6, 20, 0.0, 0.0),
            (0.5, 50, 0.01, 7, None, 2.0, 2.0), (1.5, -1, 0.0, 8, 1, 0.0, -1.0),
        ]
    ]  # fmt: skip
    outputs = [[i % 5, (3 * i) % 7, i % 5] for i in range(8)]
    rows = _rows(params, outputs)
    s = Sampler()
    together = s.sample(logits, rows)
    for i in range(8):
        alone = Sampler().sample(logits[i : i + 1], [rows[i]])
        assert alone.tokens[0] == together.tokens[i]
        assert alone.logprobs[0] == together.logprobs[i]
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(2)).tolist()
    shuffled = s.sample(logits[perm], [rows[i] for i in perm])
    assert shuffled.tokens == [together.tokens[i] for i in perm]
    assert shuffled.logprobs == [together.logprobs[i] for i in perm]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_p": -0.1},
        {"min_p": 1.5},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"logprobs": 21},
        {"logprobs": -1},
        {"logprobs": True},
    ],
)
def test_new_sampling_params_validation(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_new_fields_travel_on_the_wire():
    p = SamplingParams(min_p=0.1, presence_penalty=-1, frequency_penalty=2, logprobs=7, top_k=3)
    assert SamplingParams.from_wire(p.to_wire()) == p
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams.from_wire({**p.to_wire(), "logprobs": 2**40})
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams.from_wire({**p.to_wire(), "min_p": float("nan")})
