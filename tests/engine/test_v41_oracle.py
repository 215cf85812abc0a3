"""The V4.1 pieces DeepInfer 0.1.0 can run on CPU, against ours (v41_oracle.py says which):
config derivation and sharing maps, the Engram table layout and hash multipliers, C2 pooling
with its state across chunks, and the candidate block scores."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import v41_oracle
from deepring.model.config import ModelConfig
from deepring.model.v41.attention import _top, candidate_blocks, pool_windows
from deepring.model.v41.config import FULL, REINDEX, REUSE, WINDOW, engram_table_sizes
from deepring.model.v41.engram import hash_multipliers
from v41_helpers import tiny_dict

FLASH_SHAPE = {  # V4.1-Flash's sharing layout on a 40-layer backbone (arch notes §1.3)
    "num_hidden_layers": 40,
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 8,
    "candidate_block_size": 8,
    "index_topk": 8,
    "num_nextn_predict_layers": 3,
    "dspark_target_layer_ids": [37, 38, 39],
    "engram_layer_ids": [1, 14],
}


@pytest.fixture(scope="module")
def di():
    return v41_oracle.deepinfer()


def _configs() -> list[dict]:
    flash = tiny_dict()
    flash["text_config"].update(FLASH_SHAPE)
    return [tiny_dict(), flash]


@pytest.mark.parametrize("cfg", _configs(), ids=["tiny", "flash-layout"])
def test_config_derivation_matches_deepinfer(cfg, di, tmp_path):
    # DeepInfer also asserts its kernels' candidate limits (blocks a multiple of 8, block size
    # <= 16), which the tiny config's pool (2 x 3) is below on purpose; the maps do not
    # depend on those numbers, so its copy gets kernel-legal ones.
    legal = json.loads(json.dumps(cfg))
    legal["text_config"].update(candidate_topk_blocks=8, candidate_block_size=8)
    (tmp_path / "config.json").write_text(json.dumps(legal))
    theirs = di.load_hf_model_config(tmp_path / "config.json").gpt
    ours = ModelConfig.from_hf_dict(cfg)
    n = ours.num_hidden_layers
    assert ours.boundary == theirs.n_prefill_layer
    topo = di.SharedLayerTopology(theirs, n + ours.num_nextn_predict_layers)  # validates maps
    for layer in range(n):
        if not ours.compress_ratios[layer]:
            assert ours.mode(layer) == WINDOW
            continue
        spec = theirs.attn_module_list[layer].cfg
        assert spec.kv_compress_ratio == ours.compress_ratios[layer]
        assert topo.layer_kv_map[layer] == ours.kv_source(layer)
        assert topo.layer_index_k_map[layer] == ours.index_k_source(layer)
        assert topo.layer_index_module_map[layer] == ours.index_source(layer)
        mode = ours.mode(layer)
        assert (mode == FULL) == topo.is_kv_source_layer(layer)
        assert (mode in (FULL, REINDEX)) == topo.is_index_source_layer(layer)
        assert (mode == REUSE) == (not topo.is_index_source_layer(layer))
        in_pool = topo.layer_candidate_source_map.get(layer) not in (None, layer)
        assert ours.candidate_restricted(layer) == (in_pool and mode == REINDEX)


def test_engram_tables_and_multipliers_match_deepinfer(di):
    t = tiny_dict()["text_config"]
    t.update(engram_layer_ids=[1, 3, 4], engram_vocab_size=1000, engram_n_heads=3)
    ours = ModelConfig.from_hf_dict({**tiny_dict(), "text_config": t}).engram
    n_tables = t["engram_max_ngram_size"] - 1
    cfg = di.AttrDict(
        vocab_size=[t["engram_vocab_size"]] * n_tables,
        n_head_per_ngram=[t["engram_n_heads"]] * n_tables,
        n_embed_per_ngram=[t["engram_head_dim"] * t["engram_n_heads"]] * n_tables,
        engram_max_ngram_size=t["engram_max_ngram_size"],
        engram_layer_ids=list(t["engram_layer_ids"]),
        enable_tokenizer_compression=False,
        tokenizer_vocab_size=129280,
    )
    assert engram_table_sizes(ours) == di.EngramLayout.from_cfg(cfg).layer_vocab_sizes
    mapping = di.NgramHashMapping(cfg, device="cpu")
    for i, layer in enumerate(mapping.layer_ids):
        mults = hash_multipliers(layer, t["engram_max_ngram_size"], 129280)
        assert torch.equal(mults, mapping.ngram_multipliers[i])


@pytest.mark.parametrize("cuts", [(7,), (1, 2, 5), (4, 5, 6, 9)])
def test_c2_pooling_and_state_match_deepinfer(cuts, di):
    """A 10-token sequence fed in chunks: each chunk's pooled entries (ours vs DeepInfer's
    in-tree torch reference of its compression kernel, which rounds them to bf16)."""
    g = torch.Generator().manual_seed(sum(cuts))
    dim, ratio, total = 16, 2, 10
    score = torch.randn(total, dim, generator=g)
    latent = torch.randn(total, dim, generator=g)
    tail_kv, tail_gate = torch.zeros(1, ratio, dim), torch.zeros(1, ratio, dim)
    state = torch.zeros(1, ratio, 2, dim)  # DeepInfer's [slot, ring, (score, latent), dim]
    bounds = [0, *cuts, total]
    for lo, hi in itertools.pairwise(bounds):
        ents, firsts = pool_windows(latent[lo:hi], score[lo:hi], [0], [hi - lo], [lo], [0],
                                    tail_kv, tail_gate, ratio)  # fmt: skip
        n_ent = hi // ratio - lo // ratio
        theirs = di.compress_prefill_ref(
            score[lo:hi], latent[lo:hi], state, torch.tensor([0]),
            torch.zeros(n_ent, dtype=torch.long), torch.tensor([0, hi - lo]),
            torch.tensor([0, hi]), torch.tensor([0, n_ent]), ratio,
        )  # fmt: skip
        assert ents[0].shape == theirs.shape
        assert torch.equal(firsts[0], torch.arange(lo // ratio, hi // ratio) * ratio)
        assert torch.allclose(ents[0], theirs.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("block", [2, 3, 8])
def test_candidate_blocks_match_deepinfer(block, di):
    g = torch.Generator().manual_seed(block)
    rows, total, keep = 12, 40, 3
    # bf16-exact scores, so DeepInfer's bf16 block maxima are exact too
    scores = torch.randn(rows, total, generator=g).to(torch.bfloat16).float()
    n_vis = torch.randint(0, total + 1, (rows,), generator=g)
    vis = torch.arange(total)[None] < n_vis[:, None]
    ours = candidate_blocks(scores.masked_fill(~vis, float("-inf")), n_vis, block, keep)
    block_scores, valid = di.candidate_block_max_ref(
        scores.to(torch.bfloat16), n_vis.to(torch.int32), block
    )
    chosen = _top(block_scores.float(), keep)[1]
    for r in range(rows):
        want = {int(b) for b in chosen[r] if int(b) < int(valid[r])}
        got = {e // block for e in ours[r].nonzero().flatten().tolist() if e < int(n_vis[r])}
        assert got == want


def test_compressed_vocabulary_matches_deepinfer(di, tmp_path):
    """Engram's compressed vocabulary of the V4.1 tokenizer, ours (read from tokenizer.json)
    against DeepInfer's (HF tokenizers' decode and normalisers)."""
    import sys

    from deepring.model.v41.vocab import compressed_vocabulary
    from deepring.protocol.tokenizer import write_v41_tokenizer

    tok = write_v41_tokenizer(tmp_path / "tokenizer.json")
    meta = sys.modules["deepinfer.model_executor.models.v4_modules.engram_metadata"]
    theirs = meta.CompressedVocabulary(str(tok))
    ours = compressed_vocabulary(tok)
    assert ours == theirs.old2new
    assert max(ours) + 1 == len(theirs)  # 99093 classes for 129281 ids
