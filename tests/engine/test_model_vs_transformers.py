"""Our V4 against transformers' DeepseekV4ForCausalLM on the same random weights (fp32).

Tolerance: logits may differ by 1e-4 absolute (observed: ~5e-6; both sides sum in different
orders), and greedy generation must be token-for-token identical.
"""

from __future__ import annotations

import pytest
import torch
from v4_helpers import CONFIGS, greedy_generate, hf_twin, model_config, ours, prefill_logits

ATOL = 1e-4


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    model = ours(model_config(request.param))
    return model, hf_twin(model)


def _prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefill_logits_match(pair):
    model, hf = pair
    ids = _prompt(70, 0)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    got = prefill_logits(model, ids)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_decode_logits_match_token_by_token(pair):
    """Every decode step of ours equals transformers' decode step with its own cache."""
    model, hf = pair
    prompt = _prompt(21, 1)
    n = 40
    tokens, ours_logits = greedy_generate(model, prompt, n)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf(ids, use_cache=True)
        cache = out.cache
        ref = [out.logits[0, -1]]
        for i, tok in enumerate(tokens[:-1]):
            pos = torch.tensor([[len(prompt) + i]])
            out = hf(torch.tensor([[tok]]), cache=cache, use_cache=True, position_ids=pos)
            cache = out.cache
            ref.append(out.logits[0, -1])
    torch.testing.assert_close(ours_logits, torch.stack(ref), atol=ATOL, rtol=0)


def test_greedy_64_tokens_identical(pair):
    model, hf = pair
    prompt = _prompt(30, 2)
    ours_tokens, _ = greedy_generate(model, prompt, 64)
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=64,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )[0, len(prompt) :].tolist()
    assert ours_tokens == ref


def test_transformers_checkpoint_loads_as_is(tmp_path):
    """A checkpoint written by transformers' save_pretrained loads unchanged and gives the same
    logits."""
    from deepring.model.loader import load_model

    model = ours(model_config("swa-csa-hca"), seed=5)
    hf = hf_twin(model)
    hf.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, dtype="float32", progress=False)
    assert loaded.config.layer_types == model.config.layer_types
    assert not loaded.config.num_nextn_predict_layers  # transformers drops the MTP weights
    ids = _prompt(40, 3)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(prefill_logits(loaded.model, ids), ref, atol=ATOL, rtol=0)


def test_tiny_model_matches_transformers():
    """The embedded tiny model at its real sizes (window 128, CSA ratio 4 with top-64 selection
    among up to 80 entries, HCA ratio 128, 128-token blocks) against transformers."""
    from deepring.model.loader import load_model
    from v4_helpers import pool_for

    model = load_model("tiny", dtype="float32", progress=False).model
    hf = hf_twin(model)
    prompt = _prompt(300, 4, vocab=129000)
    n = 24
    tokens, got = greedy_generate(model, prompt, n, pool=pool_for(model, 8, 2, 128))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf(ids, use_cache=True, logits_to_keep=1)
        cache, ref = out.cache, [out.logits[0, -1]]
        for i, tok in enumerate(tokens[:-1]):
            pos = torch.tensor([[len(prompt) + i]])
            out = hf(torch.tensor([[tok]]), cache=cache, use_cache=True, position_ids=pos)
            cache = out.cache
            ref.append(out.logits[0, -1])
    torch.testing.assert_close(got, torch.stack(ref), atol=ATOL, rtol=0)
