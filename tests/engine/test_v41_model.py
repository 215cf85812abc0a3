"""The DeepSeek V4.1 model over the engine's paged caches, against the independent reference
(v41_reference.py, fp64, whole sequences, no cache) with Engram's table layout and hash
multipliers from DeepInfer 0.1.0 (v41_oracle.py).

The tiny config (v41_helpers.TINY_V41) has every mode (Full, Reindex, Reuse on both sides of
the encoder/decoder boundary), both ratios, Engram on two layers and the candidate indexer.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
import v41_oracle
from v41_helpers import greedy_generate, make_pool, new_seqs, step, tiny_dict, tiny_model
from v41_reference import ReferenceV41, engram_tables_from_deepinfer

TOL = 1e-4  # fp32 engine against the fp64 reference, on logits of magnitude ~5


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 512, (n,), generator=g).tolist()


@functools.lru_cache(maxsize=1)
def _reference() -> ReferenceV41:
    cfg = tiny_dict()
    tables = engram_tables_from_deepinfer(v41_oracle.deepinfer(), cfg["text_config"], 512)
    return ReferenceV41(cfg, dict(tiny_model().named_parameters()), tables)


@functools.lru_cache(maxsize=8)
def _ref_logits(tokens: tuple[int, ...]) -> torch.Tensor:
    return _reference().logits(list(tokens))


def test_prefill_logits_match_the_reference():
    model = tiny_model()
    prompt = _tokens(22, seed=1)
    pool = make_pool(model)
    got = step(model, pool, [new_seqs(1)[0].chunk(prompt, logits="all")])
    want = _ref_logits(tuple(prompt))
    assert (got.double() - want).abs().max() < TOL


def test_decode_steps_match_the_reference():
    """A prompt, then one token per step: every step's logits equal the reference's at that
    position (the reference is causal, so one run over the whole sequence gives them all)."""
    model = tiny_model()
    seq_tokens = _tokens(22, seed=2)
    pool = make_pool(model)
    s = new_seqs(1)[0]
    got = [step(model, pool, [s.chunk(seq_tokens[:9])])[-1]]
    for tok in seq_tokens[9:]:
        got.append(step(model, pool, [s.chunk([tok])])[-1])
    want = _ref_logits(tuple(seq_tokens))[8:]
    assert (torch.stack(got).double() - want).abs().max() < TOL


def test_greedy_generation_is_the_reference_greedy():
    model = tiny_model()
    prompt = _tokens(7, seed=3)
    out = greedy_generate(model, make_pool(model), new_seqs(1)[0], prompt, 14)
    want = _ref_logits(tuple(prompt + out[:-1]))
    ref_next = want[len(prompt) - 1 :].argmax(-1).tolist()
    assert out == ref_next


def test_batched_equals_one_at_a_time():
    model = tiny_model()
    prompts = [_tokens(n, seed=10 + n) for n in (5, 13, 19)]
    feeds = [_tokens(6, seed=20 + i) for i in range(3)]
    # Together: prefill all three, then six decode steps of all three.
    pool = make_pool(model)
    seqs = new_seqs(3)
    together = [step(model, pool, [s.chunk(p) for s, p in zip(seqs, prompts, strict=True)])]
    for k in range(6):
        together.append(
            step(model, pool, [s.chunk([f[k]]) for s, f in zip(seqs, feeds, strict=True)])
        )
    for i in range(3):
        pool = make_pool(model)
        s = new_seqs(3)[i]  # the same slot and blocks as in the batch
        alone = [step(model, pool, [s.chunk(prompts[i])])[-1]]
        alone += [step(model, pool, [s.chunk([f])])[-1] for f in feeds[i]]
        both = torch.stack([t[i] for t in together])
        assert torch.allclose(torch.stack(alone), both, atol=1e-5, rtol=0)
        assert torch.equal(torch.stack(alone).argmax(-1), both.argmax(-1))


@pytest.mark.parametrize("block_size", [6, 12])
def test_chunked_prefill_at_every_boundary_equals_whole(block_size):
    model = tiny_model()
    prompt = _tokens(17, seed=4)
    whole = step(model, make_pool(model, block_size=block_size), [
        new_seqs(1)[0].chunk(prompt, logits="all")])  # fmt: skip
    for cut in range(1, len(prompt)):
        pool = make_pool(model, block_size=block_size)
        s = new_seqs(1)[0]
        a = step(model, pool, [s.chunk(prompt[:cut], logits="all")])
        b = step(model, pool, [s.chunk(prompt[cut:], logits="all")])
        assert torch.allclose(torch.cat([a, b]), whole, atol=1e-5, rtol=0), cut


def test_three_chunks_and_a_mixed_batch_equal_whole():
    """Chunks of a prompt beside another request's decode steps in the same batch."""
    model = tiny_model()
    prompt, other = _tokens(20, seed=5), _tokens(12, seed=6)
    whole = step(model, make_pool(model), [new_seqs(1)[0].chunk(prompt, logits="all")])
    pool = make_pool(model)
    a, b = new_seqs(2)
    step(model, pool, [b.chunk(other[:9])])
    rows = []
    for lo, hi, tok in ((0, 5, other[9]), (5, 11, other[10]), (11, 20, other[11])):
        out = step(model, pool, [a.chunk(prompt[lo:hi], logits="all"), b.chunk([tok])])
        rows.append(out[:-1])
    assert torch.allclose(torch.cat(rows), whole, atol=1e-5, rtol=0)


KEEP = 6  # >= the window (4) + the ring's backtrack (2)


@pytest.mark.parametrize("cuts", [(), (5,), (11,), (12, 14), (3, 16)])
def test_decoder_bounded_replay_matches_the_reference(cuts):
    """The decoder computes only the prompt's last KEEP tokens (their windows start there):
    the prefill's last logits and the following decode steps equal the reference's `mask`
    semantics, whatever the chunking, and differ from the decoder over every token."""
    model = tiny_model()
    prompt, feed = _tokens(17, seed=7), _tokens(5, seed=8)
    lo = len(prompt) - KEEP
    pool = make_pool(model)
    s = new_seqs(1)[0]
    bounds = [0, *cuts, len(prompt)]
    for a, b in itertools.pairwise(bounds):
        out = step(model, pool, [s.chunk(prompt[a:b], "last" if b == len(prompt) else "none", lo)])
    got = [out[-1]]
    for tok in feed:
        got.append(step(model, pool, [s.chunk([tok], decoder_from=len(s.tokens) + 1 - KEEP)])[-1])
    full = tuple(prompt + feed)
    want = _reference().logits(list(full), decoder_floor=lo)[len(prompt) - 1 :]
    assert (torch.stack(got).double() - want).abs().max() < TOL
    assert (want - _ref_logits(full)[len(prompt) - 1 :]).abs().max() > 1e-2


def test_prefix_hit_with_a_ring_and_a_replayed_ring():
    """Blocks [0, 12) cached. With the ring snapshot at 12 the continuation is exact (equals
    the whole prefill); without it the last window (4 tokens) is replayed, windows restarting
    at 8, the cached blocks' entries kept: equal to the reference's bounded-replay semantics
    (and not to the whole prefill: it is an approximation)."""
    from deepring.cache.pool import SLOT_FIELDS
    from v41_helpers import Seq

    model = tiny_model()
    prompt, feed = _tokens(18, seed=11), _tokens(3, seed=12)
    pool = make_pool(model)
    whole = step(model, make_pool(model), [new_seqs(1)[0].chunk(prompt + feed, logits="all")])
    first = Seq(0, [1, 2, 3])
    step(model, pool, [first.chunk(prompt[:12], "none")])
    # A ring hit: the cached blocks and the ring (and tails) at 12 in a fresh slot.
    for lc in pool.layers:
        for f in SLOT_FIELDS:
            if (t := getattr(lc, f)) is not None:
                t[1] = t[0]
    hit = Seq(1, [1, 2, 9, 10])
    hit.tokens = prompt[:12]
    got = [step(model, pool, [hit.chunk(prompt[12:], "all")])]
    got += [step(model, pool, [hit.chunk([t])]) for t in feed]
    assert torch.allclose(torch.cat(got), whole[12:], atol=1e-5, rtol=0)
    # No ring: replay from 12 - window with a window floor; entries before 12 stay cached.
    replay = Seq(2, [1, 2, 11, 12])
    replay.tokens = prompt[:8]
    chunk = replay.chunk(prompt[8:], "all")
    chunk.window_floor, chunk.compress_from = 8, 12
    got = [step(model, pool, [chunk])[4:]]
    got += [step(model, pool, [replay.chunk([t])]) for t in feed]
    got = torch.cat(got).double()
    want = _reference().logits(prompt + feed, replay=(8, 12))[12:]
    assert (got - want).abs().max() < TOL
    assert (got - whole[12:].double()).abs().max() > 1e-3


def test_decoder_replay_beside_decode_rows_equals_alone():
    """A prompt under decoder replay chunked beside another request's decode steps: the same
    logits as each alone (the decoder's sub-batch keeps the right rows and windows)."""
    model = tiny_model()
    prompt, other = _tokens(17, seed=13), _tokens(12, seed=14)
    lo = len(prompt) - KEEP

    def run(together: bool) -> list[torch.Tensor]:
        pool = make_pool(model)
        a, b = new_seqs(2)
        step(model, pool, [b.chunk(other[:9])])
        out = []
        for (x, y), tok in zip(((0, 9), (9, 13), (13, 17)), other[9:], strict=True):
            ca = a.chunk(prompt[x:y], "last" if y == len(prompt) else "none", lo)
            if together:
                out.append(step(model, pool, [ca, b.chunk([tok])]))
            else:
                mine = step(model, pool, [ca])  # (no rows before the prompt's last chunk)
                if y == len(prompt):
                    out.append(mine)
                out.append(step(model, pool, [b.chunk([tok])]))
        return out

    joint, alone = run(True), run(False)
    assert torch.allclose(joint[-1][0], alone[-2][0], atol=1e-5, rtol=0)  # the prompt's row
    for k in range(3):
        assert torch.allclose(joint[k][-1], alone[k if k < 2 else 3][-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"kv_source_layer_ids": [2]}, "layer 5 has ratio 1 but its KV source 2 has ratio 2"),
        ({"engram_layer_ids": [1, 6]}, "engram layers must be encoder layers"),
        ({"index_source_layer_ids": [3, 5]}, "sources must nest"),
        ({"compress_ratios": [0, 0, 4, 2, 2, 1, 1, 1, 1]}, "compress ratios must be in"),
        ({"candidate_topk_blocks": 1}, "candidate pool must hold at least index_topk"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_bad_configs_are_refused_by_name(edit, match):
    from deepring.model.config import ModelConfig

    cfg = tiny_dict()
    cfg["text_config"].update(edit)
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_dict(cfg)


def test_missing_key_is_named():
    from deepring.model.config import ModelConfig

    cfg = tiny_dict()
    del cfg["text_config"]["kv_source_layer_ids"]
    with pytest.raises(ValueError, match="kv_source_layer_ids"):
        ModelConfig.from_hf_dict(cfg)


def test_engram_with_the_compressed_vocabulary(tmp_path):
    """Engram hashing compressed ids (the V4.1 tokenizer's normalised classes): engine against
    the reference fed DeepInfer's own compressed vocabulary and hash multipliers."""
    import sys

    from deepring.model.config import ModelConfig
    from deepring.model.v41.model import DeepseekV41
    from deepring.model.v41.weights import init_dummy_v41
    from deepring.protocol.tokenizer import write_v41_tokenizer

    tok = write_v41_tokenizer(tmp_path / "tokenizer.json")
    cfg = tiny_dict()
    cfg["text_config"]["engram_compressed_vocab_size"] = 99093
    model = DeepseekV41(ModelConfig.from_hf_dict(cfg), tokenizer=tok)
    init_dummy_v41(model, 0)
    model.eval().requires_grad_(False)
    model.decoder_keep = 0
    di = v41_oracle.deepinfer()
    tables = engram_tables_from_deepinfer(di, cfg["text_config"], 512, tokenizer=tok)
    meta = sys.modules["deepinfer.model_executor.models.v4_modules.engram_metadata"]
    lookup = meta.CompressedVocabulary(str(tok)).old2new
    ref = ReferenceV41(cfg, dict(model.named_parameters()), tables, engram_lookup=lookup)
    tokens = _tokens(14, seed=15)
    pool = make_pool(model)
    s = new_seqs(1)[0]
    got = [step(model, pool, [s.chunk(tokens[:9], logits="all")])]
    got += [step(model, pool, [s.chunk([t])]) for t in tokens[9:]]
    assert (torch.cat(got).double() - ref.logits(tokens)).abs().max() < TOL
