"""DSpark speculative decoding on V4.1 (issue 21): the drafter's drafts and confidences against
an independent fp64 reference (v41_dspark_reference, with DeepInfer's own torch references for
the taps, the draft window and the confidence); greedy and sampled output identical to plain
decoding whatever the drafts (drafters always right, always wrong, right for a random prefix,
and the model's own), past the decoder's KEEP and with images; the caches after rejections
equal those of a run that never saw the rejected tokens (plain and FP4 global KV); a ring hit
restores the drafter's context."""

from __future__ import annotations

import random

import pytest
import torch
import v41_oracle
from deepring import LLM, SamplingParams
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.config import SpecMode
from deepring.core import drafters
from deepring.core.engine import EngineCore
from deepring.core.runner import ModelRunner
from deepring.core.scheduler import SchedulerConfig
from test_speculative import ScriptedDrafter, _prompts
from v41_dspark_reference import ReferenceDrafter
from v41_helpers import tiny_dict, tiny_model
from v41_reference import ReferenceV41, engram_tables_from_deepinfer

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _engine(mode: str, keep: int = 0, budget: int = 2048) -> EngineCore:
    """The structurally complete tiny V4.1 (window 4, blocks of 3 drafts) behind an engine;
    keep: the decoder's bounded replay (0: every prompt row)."""
    model = tiny_model()
    cache = CacheConfig(num_blocks=96, num_slots=8, block_size=6, backtrack=3)
    pool = KVCachePool(model.config.cache_layout(model.dtype), cache, model.device)
    runner = ModelRunner(model, pool)
    runner.keep = keep
    eng = EngineCore(
        runner, cache, SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget),
        max_model_len=256, vocab_size=512,
    )  # fmt: skip
    eng.enable_speculation(SpecMode.parse(mode), "tiny-v41")
    return eng


def _run(eng: EngineCore, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    reqs = [eng.add(i, p, params, seed=7 + i) for i, p in enumerate(prompts)]
    for _ in range(2000):
        if not eng.has_work:
            break
        eng.step()
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("keep", [0, 8])
def test_drafts_and_confidences_are_the_references(monkeypatch, keep):
    """Every proposal of the engine's drafter (three requests decoding side by side, prompts
    longer than KEEP when keep is 8: their first rows have no taps) equals the reference's
    greedy drafts for the same tokens, and its acceptance probabilities match."""
    monkeypatch.setattr(drafters, "SMALL_BLOCK", 0)  # the exact greedy head, not bf16 logits
    seen = []
    propose = drafters.DSparkContext.propose

    def spy(self, reqs):
        out = propose(self, reqs)
        for r, d in zip(reqs, out.drafts, strict=True):
            conf = torch.sigmoid(torch.tensor(self._conf[id(r)])).tolist()
            seen.append((list(r.prompt_ids) + list(r.output_ids), len(r.prompt_ids), d, conf))
        return out

    monkeypatch.setattr(drafters.DSparkContext, "propose", spy)
    eng = _engine("fixed:3", keep=keep)
    prompts = [p for p in _prompts(3, (5, 11, 17))]
    _run(eng, [[min(t, 499) for t in p] for p in prompts], SamplingParams(temperature=0,
         max_tokens=7, ignore_eos=True))  # fmt: skip
    assert len(seen) >= 12
    di = v41_oracle.deepinfer()
    cfg = tiny_dict()
    tables = engram_tables_from_deepinfer(di, cfg["text_config"], 512)
    ref = ReferenceDrafter(ReferenceV41(cfg, dict(tiny_model().named_parameters()), tables), di)
    for tokens, n_prompt, drafts, conf in seen:
        want, want_conf = ref.draft(tokens, decoder_floor=max(0, n_prompt - keep) if keep else 0)
        assert drafts == want, (tokens, drafts, want)
        torch.testing.assert_close(torch.tensor(conf), torch.tensor(want_conf), atol=1e-5,
                                   rtol=1e-4)  # fmt: skip


@pytest.mark.parametrize("right", [0, None, 3])
@pytest.mark.parametrize("keep", [0, 8])
def test_greedy_identical_whatever_the_drafts(right, keep):
    prompts = [[min(t, 499) for t in p] for p in _prompts(1, (3, 11, 20, 40))]
    plain = _engine("fixed:3", keep=keep)
    plain.spec = None
    want = _run(plain, prompts, GREEDY)
    truth = {i: p + o for i, (p, o) in enumerate(zip(prompts, want, strict=True))}
    eng = _engine("fixed:3", keep=keep)
    eng.spec.drafter = ScriptedDrafter(truth, 3, right)
    assert _run(eng, prompts, GREEDY) == want
    spec = eng.spec
    assert spec.verified > 0
    if right == 3:
        assert spec.accepted == spec.verified
    if right == 0:
        assert spec.accepted == 0


@pytest.mark.parametrize("mode", ["fixed:3", "dspark"])
def test_greedy_identical_with_the_models_drafter(mode):
    prompts = [[min(t, 499) for t in p] for p in _prompts(2, (5, 13, 33))]
    plain = _engine(mode)
    plain.spec = None
    eng = _engine(mode, budget=16)  # prompt chunks beside verify rows
    assert _run(eng, prompts, GREEDY) == _run(plain, prompts, GREEDY)
    assert eng.spec.verified > 0


def test_sampled_output_is_plain_samplings():
    """Sampling draws from (seed, position) only: the same tokens with and without drafts."""
    prompts = [[min(t, 499) for t in p] for p in _prompts(5, (4, 19))]
    params = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=20, ignore_eos=True)
    plain = _engine("fixed:3")
    plain.spec = None
    want = _run(plain, prompts, params)
    truth = {i: p + o for i, (p, o) in enumerate(zip(prompts, want, strict=True))}
    eng = _engine("fixed:3")
    eng.spec.drafter = ScriptedDrafter(truth, 3, None, seed=2)
    assert _run(eng, prompts, params) == want
    assert 0 < eng.spec.accepted < eng.spec.verified


def _pool_tensors(eng) -> list[torch.Tensor]:
    return [t.clone() for t in eng.pool.slot_tensors() + eng.pool.block_tensors()]


@pytest.mark.parametrize("kv", ["plain", "fp4"])
def test_rollback_leaves_the_caches_as_if_never_seen(monkeypatch, kv):
    """A request whose verify steps cross ratio-2 windows and 6-token blocks, drafts right for
    a random prefix: after each step every cache tensor (rings of the encoder, the decoder and
    the drafter, compressor tails, main KV and indexer pages, FP4 or not) equals that of an
    engine fed exactly the accepted tokens."""
    monkeypatch.setenv("DEEPRING_V41_KV_CACHE", kv)
    prompt = [min(t, 499) for t in _prompts(4, (13,))[0]]
    plain = _engine("fixed:3")
    plain.spec = None
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    truth = prompt + _run(plain, [prompt], params)[0]
    a, b = _engine("fixed:3"), _engine("fixed:3")
    ra, rb = (e.add(0, prompt, params, seed=1) for e in (a, b))
    for e in (a, b):
        e.spec.drafter = ScriptedDrafter({0: truth}, 3, 0)
        e.step()  # the prompt: first token, no drafts
    rng = random.Random(5)
    rejected = 0
    while ra.num_tokens < len(prompt) + 30:
        n = ra.num_tokens
        right = rng.randrange(3)
        ra.drafts = truth[n : n + right] + [7, 8, 9][: 3 - right]
        rb.drafts = truth[n : n + right]
        a.step()
        b.step()
        rejected += 3 - right
        assert ra.output_ids == rb.output_ids == truth[len(prompt) : ra.num_tokens]
        assert ra.num_cached == rb.num_cached == ra.num_tokens - 1
        for x, y in zip(_pool_tensors(a), _pool_tensors(b), strict=True):
            if x.dtype == torch.uint8:  # FP4 pages: the same rows quantise the same
                assert torch.equal(x, y)
            else:
                torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
    assert rejected > 10


def test_images_with_speculative_decoding():
    """A prompt with two images: the same greedy tokens with drafts as without."""
    from test_v41_image_requests import _prompt

    ids, images = _prompt((1, 2))
    out = []
    for spec in (False, True):
        eng = _engine("fixed:3", budget=13)
        if not spec:
            eng.spec = None
        req = eng.add(0, ids, GREEDY, seed=1, images=images)
        for _ in range(500):
            if not eng.has_work:
                break
            eng.step()
        out.append(req.output_ids)
        assert not req.image_embeds
    assert out[0] == out[1]
    assert len(out[0]) == GREEDY.max_tokens


def test_the_embedded_model_drafts_and_refuses_mtp(deepring_cache_dir):
    """v41-tiny serves dspark and fixed:N (its window ring grows by the drafts, KEEP 140 still
    covers it) with the plain output; MTP is refused: it has a DSpark drafter instead."""
    prompts = [list(range(1000, 1000 + n)) for n in (20, 150)]  # one past KEEP
    want = LLM("v41-tiny", max_model_len=512).generate(prompts, GREEDY)
    llm = LLM("v41-tiny", max_model_len=512, speculative="fixed:5")
    got = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert llm.engine.spec.verified > 0
    with pytest.raises(ValueError, match="has a DSpark drafter in their place"):
        LLM("v41-tiny", max_model_len=512, speculative="mtp")


def test_a_prefix_hit_drafts_as_a_cold_engine(deepring_cache_dir):
    """v41-tiny with the prefix cache: a second prompt sharing 256 tokens with the first takes
    them from the cache (its decoder replays from the prompt's last KEEP tokens, and the drafter
    reads those rows' taps), and drafts and emits exactly what a cold engine does."""
    from test_speculative_features import _recording, assert_same_drafts_where_both_drafted

    g = torch.Generator().manual_seed(9)
    first = torch.randint(3, 3000, (300,), generator=g).tolist()
    second = first[:256] + torch.randint(3, 3000, (24,), generator=g).tolist()
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    warm = LLM("v41-tiny", max_model_len=1024, max_num_seqs=2, speculative="fixed:5")
    warm.generate([first], SamplingParams(temperature=0, max_tokens=1))
    seen = _recording(warm)
    got = warm.generate([second], p)[0]
    assert warm.engine.prefix.stats["hit_tokens"] > 0, warm.engine.prefix.stats
    cold = LLM("v41-tiny", max_model_len=1024, max_num_seqs=2, speculative="fixed:5")
    want_seen = _recording(cold)
    want = cold.generate([second], p)[0]
    assert got.token_ids == want.token_ids
    assert_same_drafts_where_both_drafted(seen, want_seen)
