"""The engine's drafters against the plain references: DSpark's kept per-stage context rings
give the block the plain forward (model.dspark.block_hidden) computes from the whole sequence,
and the drafts the engine proposes are the plain forward's greedy drafts."""

from __future__ import annotations

import json

import pytest
import torch
from deepring import LLM, SamplingParams
from deepring.core.drafters import DSparkContext
from deepring.model.batch import ForwardBatch, SeqChunk


def test_block_from_context_equals_block_hidden(deepring_cache_dir):
    llm = LLM("tiny-trained", max_model_len=512)
    dr = llm.model.mtp
    embed = llm.model.model.embed_tokens
    g = torch.Generator().manual_seed(0)
    s, d = 230, llm.config.hidden_size
    taps = torch.randn(1, s, len(dr.ds.target_layer_ids), d, generator=g)
    anchors = [1, 7, 128, 129, 200, 230]
    ids = torch.randint(0, 5000, (1, len(anchors)), generator=g)
    pos = torch.tensor([anchors])
    with torch.no_grad():
        want = dr.block_hidden(taps, ids, pos, embed)[0]
        ctx = dr.context_kv(taps[0], torch.arange(s))
        # Kept in a shuffled order (a ring's), with the rows each anchor may see marked.
        perm = torch.randperm(s, generator=g)
        window = llm.config.sliding_window
        valid = torch.stack([(perm < p) & (perm >= p - window) for p in anchors])
        got = dr.block_from_context(
            [c[perm].expand(len(anchors), -1, -1) for c in ctx],
            valid,
            ids[0],
            pos[0],
            embed,
        )
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("batch", [1, 2])
def test_engine_drafts_are_the_plain_forwards(deepring_cache_dir, monkeypatch, batch):
    """batch 1 takes the bf16 block logits (drafters.SMALL_BLOCK), batch 2 the greedy head."""
    llm = LLM("tiny-trained", max_model_len=512, max_num_seqs=4, speculative="fixed:5")
    seen = []
    propose = DSparkContext.propose

    def spy(self, reqs):
        out = propose(self, reqs)
        for r, d in zip(reqs, out.drafts, strict=True):
            seen.append((list(r.prompt_ids) + list(r.output_ids), d))
        return out

    monkeypatch.setattr(DSparkContext, "propose", spy)
    text = "import os\n\n\ndef main(argv):\n    for name in argv:\n        print(name)\n"
    prompts = [text, "class A:\n    pass\n" * 3][:batch]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=60))
    assert len(seen) >= 8
    model, pool = llm.model, llm.engine.pool
    dr = model.mtp
    agree = total = 0
    for tokens, drafts in seen:
        # The whole sequence once through the target in a scratch slot, for its taps.
        chunk = SeqChunk(tokens[:-1], 0, 3, list(range(1, 6)), logits="none")
        batch = ForwardBatch.build([chunk], model.rope_tables(), pool.cache.block_size, "cpu")
        taps = model(batch, pool, taps=dr.ds.target_layer_ids).taps
        with torch.no_grad():
            h = dr.block_hidden(
                taps[None],
                torch.tensor([[tokens[-1]]]),
                torch.tensor([[len(tokens) - 1]]),
                model.model.embed_tokens,
            )
            want, _, _ = dr.draft_greedy(h[0, 0], torch.tensor(tokens[-1]), model.lm_head.weight)
        agree += sum(a == b for a, b in zip(want.tolist(), drafts, strict=False))
        total += len(drafts)
    # Taps from decode steps and from one prefill differ in rounding only (and batch 1's
    # logits are bf16: a near-tie may go the other way).
    assert agree >= 0.9 * total, (agree, total)


def test_online_calibration_recovers_the_temperatures():
    """Outcomes drawn with P(accept draft g | drafts before accepted) = sigmoid(z_g / T_g): the
    refit finds T, from samples where only the prefix up to the first rejection was tested."""
    from deepring.core.drafters import OnlineCalibration

    true_t = torch.tensor([0.5, 2.0, 4.0])
    cal = OnlineCalibration((1.0, 1.0, 1.0), 3)
    g = torch.Generator().manual_seed(0)
    for _ in range(OnlineCalibration.KEEP):
        z = torch.randn(3, generator=g) * 3
        ok = torch.rand(3, generator=g) < torch.sigmoid(z / true_t)
        accepted = int(ok.long().cumprod(0).sum())
        cal.add(z.tolist(), 3, accepted)
    # Fits at FIRST, 2 FIRST, 4 FIRST, ... samples up to REFIT, then every REFIT.
    first, refit, keep = OnlineCalibration.FIRST, OnlineCalibration.REFIT, OnlineCalibration.KEEP
    doubling = [first * 2**k for k in range(8) if first * 2**k <= refit]
    assert cal.fits == len(doubling) + (keep - doubling[-1]) // refit
    torch.testing.assert_close(cal.temps, true_t, rtol=0.2, atol=0.0)


def test_online_calibration_fits_early_and_only_positions_it_has_seen():
    """The first fit comes after FIRST request-steps; a position tested fewer than
    MIN_SAMPLES times (drafts after an early rejection are never tested) keeps its
    temperature, the others move towards the truth."""
    from deepring.core.drafters import OnlineCalibration

    cal = OnlineCalibration((3.0, 3.0, 3.0), 3)
    g = torch.Generator().manual_seed(1)
    for i in range(OnlineCalibration.FIRST):
        z = torch.randn(3, generator=g) * 3
        ok = bool(torch.rand(1, generator=g) < torch.sigmoid(z[0] / 0.5))
        # All three drafts verified in the first few steps only (then draft 1 is tested when
        # draft 0 survived, and rejected); one draft verified in the others.
        verified = 3 if i < OnlineCalibration.MIN_SAMPLES // 4 else 1
        assert cal.fits == 0
        cal.add(z.tolist(), verified, int(ok))
    assert cal.fits == 1
    assert float(cal.temps[0]) < 1.5  # fitted: the truth is 0.5
    assert cal.temps[1:].tolist() == [3.0, 3.0]  # too few outcomes: kept


def test_the_engine_refits_on_its_own_outcomes(deepring_cache_dir, monkeypatch):
    from deepring.core.drafters import OnlineCalibration

    monkeypatch.setattr(OnlineCalibration, "REFIT", 16)
    llm = LLM("tiny-trained", max_model_len=512, max_num_seqs=4, speculative="fixed:5")
    cal = llm.engine.spec.drafter.calibration
    before = cal.temps.clone()
    text = "def main(argv):\n    for name in argv:\n"
    llm.generate([text] * 4, SamplingParams(temperature=0, max_tokens=40))
    assert cal.fits >= 1
    assert not torch.equal(cal.temps, before)
    assert bool((cal.temps > 0).all())


def test_the_draft_vocabulary_file_is_checked(tmp_path):
    from deepring.model.dspark import DRAFT_VOCAB_FILE, read_draft_vocab

    assert read_draft_vocab(tmp_path, 100) is None  # no file: the whole vocabulary
    assert read_draft_vocab(None, 100) is None
    f = tmp_path / DRAFT_VOCAB_FILE
    f.write_text("[5, 0, 99]")
    assert read_draft_vocab(tmp_path, 100).tolist() == [5, 0, 99]
    for text, message in [
        ("[5, 0", "not a JSON list"),
        ("{}", "non-empty JSON list"),
        ("[]", "non-empty JSON list"),
        ("[1, 100]", r"token id in \[0, 100\)"),
        ("[1, -1]", r"token id in \[0, 100\)"),
        ("[1, 2.0]", r"token id in \[0, 100\)"),
        ("[true]", r"token id in \[0, 100\)"),
        ("[3, 4, 3]", "distinct"),
    ]:
        f.write_text(text)
        with pytest.raises(ValueError, match=message) as err:
            read_draft_vocab(tmp_path, 100)
        assert DRAFT_VOCAB_FILE in str(err.value)


def test_tiny_trained_drafts_from_its_corpus_vocabulary(deepring_cache_dir):
    """The assembled tiny-trained checkpoint names the corpus's tokens as its drafter's
    vocabulary: exactly the rows of its LM head that are not zero."""
    llm = LLM("tiny-trained", max_model_len=512, speculative="fixed:5")
    vocab = llm.model.draft_vocab
    nonzero = llm.model.lm_head.weight.abs().sum(1).nonzero().flatten()
    assert vocab is not None
    assert sorted(vocab.tolist()) == nonzero.tolist()
    assert llm.engine.spec.drafter._vocab is not None


def test_a_small_draft_vocabulary_limits_the_drafts_not_the_output(
    deepring_cache_dir, tmp_path, monkeypatch
):
    """A checkpoint whose draft_vocab.json lists only the 200 most frequent tokens: every
    draft is one of them, and greedy output is still exactly non-speculative decoding's."""
    from deepring.model.dspark import DRAFT_VOCAB_FILE
    from deepring.model.loader import resolve_model_path

    src = resolve_model_path("tiny-trained")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in src.iterdir():
        if f.name != DRAFT_VOCAB_FILE:
            (ckpt / f.name).symlink_to(f)
    full = json.loads((src / DRAFT_VOCAB_FILE).read_text())
    (ckpt / DRAFT_VOCAB_FILE).write_text(json.dumps(full[:200]))
    allowed = set(full[:200])
    seen: list[list[int]] = []
    propose = DSparkContext.propose

    def spy(self, reqs):
        out = propose(self, reqs)
        seen.extend(out.drafts)
        return out

    monkeypatch.setattr(DSparkContext, "propose", spy)
    prompts = ["import os\n\n\ndef main(argv):\n", "class A:\n    def f(self):\n"]
    params = SamplingParams(temperature=0, max_tokens=40)
    spec = LLM(str(ckpt), max_model_len=512, max_num_seqs=4, speculative="fixed:5")
    got = [o.token_ids for o in spec.generate(prompts, params)]
    want = [o.token_ids for o in LLM(str(ckpt), max_model_len=512).generate(prompts, params)]
    assert got == want
    assert sum(len(d) for d in seen) >= 40
    assert {t for d in seen for t in d} <= allowed
