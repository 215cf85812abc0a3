"""Log probabilities and penalties through the engine (LLM on the tiny model), against an
independent recomputation: the model's forward over the whole sequence in one prefill on a
fresh cache (no scheduler, no chunking, no sampler), then torch's log_softmax of the step's
logits less the penalties of the output before it, over the temperature."""

from __future__ import annotations

import pytest
import torch
from deepring import LLM, SamplingParams
from v4_helpers import pool_for, prefill_logits

ATOL = 2e-4


@pytest.fixture(scope="module")
def llm(deepring_cache_dir):
    return LLM("tiny", max_num_seqs=4, max_model_len=512, max_num_batched_tokens=64)


def _prompt(n: int, salt: int) -> list[int]:
    return [(29 * j + 97 * salt) % 120000 + 3 for j in range(n)]


def _reference(llm: LLM, prompt: list[int], output: list[int], p: SamplingParams):
    """Per output position i: the log_softmax the engine should report for token i."""
    model = llm.model
    ids = prompt + output
    pool = pool_for(model, num_blocks=8, num_slots=1, block_size=128)
    with torch.no_grad():
        logits = prefill_logits(model, ids[:-1], pool=pool)[len(prompt) - 1 :].double()
    out = []
    for i in range(len(output)):
        before = torch.tensor(output[:i], dtype=torch.long)
        counts = torch.bincount(before, minlength=logits.shape[1])
        pen = p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        out.append(torch.log_softmax((logits[i] - pen) / (p.temperature or 1.0), -1))
    return torch.stack(out)


CASES = [
    SamplingParams(temperature=0, max_tokens=8, logprobs=5),
    SamplingParams(temperature=0, max_tokens=10, logprobs=2, frequency_penalty=1.5,
                   presence_penalty=0.5),
    SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=8, logprobs=3,
                   frequency_penalty=0.4, presence_penalty=-0.3),
    SamplingParams(temperature=1.2, top_k=40, min_p=0.05, seed=9, max_tokens=8, logprobs=0),
]  # fmt: skip


@pytest.mark.parametrize("params", CASES)
def test_logprobs_equal_a_log_softmax_of_the_same_steps_logits(llm, params):
    prompt = _prompt(150, 1)  # two prefill chunks of the 64-token budget
    out = llm.generate([prompt], [params])[0]
    assert len(out.logprobs) == len(out.token_ids) == params.max_tokens
    ref = _reference(llm, prompt, out.token_ids, params)
    for i, (tok, (lp, top)) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        assert lp == pytest.approx(float(ref[i, tok]), abs=ATOL)
        assert len(top) == params.logprobs
        vals = [v for _, v in top]
        assert vals == sorted(vals, reverse=True)
        want = torch.topk(ref[i], params.logprobs).values.tolist() if params.logprobs else []
        assert vals == pytest.approx(want, abs=ATOL)
        for t, v in top:
            assert v == pytest.approx(float(ref[i, t]), abs=ATOL)
        # The sampled token is among the alternatives whenever it ranks among them.
        rank = int((ref[i] > ref[i, tok] + ATOL).sum())
        if rank < params.logprobs - 1:
            assert tok in [t for t, _ in top]
        if params.greedy:
            # Greedy takes the argmax of the penalised logits (no token above it).
            assert rank == 0


@pytest.mark.parametrize("penalty", [2.0, -2.0])
def test_penalties_change_greedy_output_and_match_the_reference(llm, penalty):
    prompt = _prompt(40, 2)
    plain = llm.generate([prompt], [SamplingParams(temperature=0, max_tokens=24)])[0].token_ids
    p = SamplingParams(
        temperature=0, max_tokens=24, frequency_penalty=penalty, presence_penalty=penalty,
        logprobs=1,
    )  # fmt: skip
    out = llm.generate([prompt], [p])[0]
    got = out.token_ids
    ref = _reference(llm, prompt, got, p)
    assert got == ref.argmax(-1).tolist()
    # Every earlier output token moves the normaliser: the log probabilities see all of them.
    for i, (lp, _) in enumerate(out.logprobs):
        assert lp == pytest.approx(float(ref[i, got[i]]), abs=ATOL)
    assert len(set(plain)) == len(plain)  # the tiny model does not repeat itself here ...
    if penalty < 0:
        assert len(set(got)) < len(got)  # ... unless its output is rewarded


def test_requests_without_logprobs_get_none_and_the_same_tokens(llm):
    prompt = _prompt(30, 3)
    a = SamplingParams(temperature=0.9, seed=4, max_tokens=6)
    b = SamplingParams(temperature=0.9, seed=4, max_tokens=6, logprobs=4)
    ga, gb = llm.generate([prompt, prompt], [a, b])
    assert ga.logprobs is None
    assert ga.token_ids == gb.token_ids
