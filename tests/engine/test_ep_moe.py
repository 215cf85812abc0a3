"""Expert parallel over gloo ranks on CPU: every rank runs its own requests (attention data
parallel) through a model whose routed experts are spread over the group, and every request's
logits and greedy tokens match the single-process fp32 model -- prefill (chunked), decode and
mixed batches, ranks idle at some steps, with and without redundant expert slots, before and
after a run-time rearrangement."""

from __future__ import annotations

import pytest
import torch
from ep_helpers import N_DECODE, SEED, Workload, prompts, run_group, save_per_expert
from quant_helpers import write_quantised_v4
from v4_helpers import greedy_generate, model_config, ours, prefill_logits

# Without and with redundant slots at 2 ranks; 4 ranks with them (4 ranks without them takes
# the 2-rank path with a quarter of the experts per rank: left out, ~20 s of CI per run).
CASES = [
    Workload("swa-csa-hca", n_ranks=2, n_redundant=0, rebalance_at=6),
    Workload("swa-csa-hca", n_ranks=2, n_redundant=2, rebalance_at=6),
    Workload("swa-csa-hca", n_ranks=4, n_redundant=4, rebalance_at=7),
]


@pytest.fixture(scope="module")
def reference():
    """Per config: the single-process model's prefill logits, greedy tokens and decode logits
    of every prompt, each request alone."""
    cache = {}

    def get(w: Workload):
        if w.config not in cache:
            model = ours(model_config(w.config), seed=SEED)
            cache[w.config] = model
        model = cache[w.config]
        out = {}
        for i, p in enumerate(prompts(w)):
            tokens, decode = greedy_generate(model, p, N_DECODE)
            out[i] = {"tokens": tokens, "decode": decode, "prefill": prefill_logits(model, p)}
        return out

    return get


@pytest.mark.parametrize("w", CASES, ids=lambda w: f"ep{w.n_ranks}-k{w.n_redundant}")
def test_expert_parallel_matches_single_process(w, reference, tmp_path):
    ranks = run_group(w, tmp_path)
    ref = reference(w)
    config = model_config(w.config)
    per_rank = (config.n_routed_experts + w.n_redundant) // w.n_ranks
    seen = {}
    for r, res in enumerate(ranks):
        # Each rank holds only its slots: 1/N of the experts plus its share of the spares.
        assert res["slots"] == [per_rank] * config.num_hidden_layers
        for rid, got in res["requests"].items():
            assert rid % w.n_ranks == r
            seen[rid] = got
    assert sorted(seen) == sorted(ref)
    for rid, got in seen.items():
        want = ref[rid]
        assert got["tokens"] == want["tokens"], rid
        torch.testing.assert_close(got["prefill"], want["prefill"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got["decode"], want["decode"], rtol=1e-4, atol=1e-4)
    # The rearrangement moved experts (so the steps after it test a new placement), and every
    # rank agrees on the placements and on the per-step loads (one all_gather per layer).
    assert any(ranks[0]["changed"])
    for res in ranks[1:]:
        assert res["changed"] == ranks[0]["changed"]
        assert res["step_loads"] == ranks[0]["step_loads"]
    # The load record counts every (token, pick) once: k picks per token of every prefill and
    # decode row of every request, in every layer.
    k = config.num_experts_per_tok
    rows = sum(len(p) + N_DECODE - 1 for p in prompts(w))
    total = sum(sum(step) for step in ranks[0]["step_loads"])
    assert total == rows * k * config.num_hidden_layers
    assert ranks[0]["balance"] >= 1.0


def test_ranks_that_load_only_their_experts_match_the_single_process(reference, tmp_path):
    """Each rank reads its own experts from a per-expert checkpoint of the same model (never
    the whole model), then serves and rearranges as before: the same logits and tokens."""
    w = CASES[1]  # EP2 with redundant slots, a rebalance mid-run
    save_per_expert(ours(model_config(w.config), seed=SEED), tmp_path / "ckpt")
    ranks = run_group(w, tmp_path, checkpoint=tmp_path / "ckpt")
    ref = reference(w)
    seen = {rid: got for res in ranks for rid, got in res["requests"].items()}
    assert sorted(seen) == sorted(ref)
    for rid, got in seen.items():
        assert got["tokens"] == ref[rid]["tokens"], rid
        torch.testing.assert_close(got["prefill"], ref[rid]["prefill"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got["decode"], ref[rid]["decode"], rtol=1e-4, atol=1e-4)
    assert any(ranks[0]["changed"])


def test_ranks_with_experts_kept_in_mxfp4_match_the_dequantised_single_process(
    tmp_path, monkeypatch
):
    """A checkpoint in the official quantised layout (FP8 dense weights, MXFP4 experts): each
    rank keeps its experts' packed bytes and scales (the kernels in Triton's interpreter),
    serves and rearranges mid-run, so the scales move with their rows: the logits and tokens
    of the single-process model dequantised at load."""
    pytest.importorskip("triton")
    from deepring.model.loader import load_model

    w = CASES[1]  # EP2 with redundant slots, a rebalance mid-run
    write_quantised_v4(ours(model_config(w.config), seed=SEED), tmp_path / "ckpt")
    plain = load_model(tmp_path / "ckpt", dtype="float32", progress=False, quantised="dequantise")
    want = {}
    for i, p in enumerate(prompts(w)):
        tokens, decode = greedy_generate(plain.model, p, N_DECODE)
        want[i] = {"tokens": tokens, "decode": decode, "prefill": prefill_logits(plain.model, p)}
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the ranks' kernels (they inherit it)
    ranks = run_group(w, tmp_path, checkpoint=tmp_path / "ckpt", quantised="keep")
    assert all(q == ("mxfp4", 32) for res in ranks for q in res["quant"])
    seen = {rid: got for res in ranks for rid, got in res["requests"].items()}
    assert sorted(seen) == sorted(want)
    for rid, got in seen.items():
        assert got["tokens"] == want[rid]["tokens"], rid
        for part in ("prefill", "decode"):
            scale = want[rid][part].abs().max()
            torch.testing.assert_close(
                got[part], want[rid][part], rtol=1e-4, atol=1e-4 * scale, msg=f"{rid} {part}"
            )
    assert any(ranks[0]["changed"])
