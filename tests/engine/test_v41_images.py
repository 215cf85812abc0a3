"""Images inside a V4.1 prompt: span rows take their embeddings (SeqChunk.embeds), route with
the image bias `bias_vl`, take no Engram memory and cut the n-grams of the tokens after them.
The engine over its paged caches against the independent fp64 reference (v41_reference.py)
given the same embeddings, whole and chunked at every boundary."""

from __future__ import annotations

import functools

import pytest
import torch
import v41_oracle
from deepring.model.batch import ForwardBatch
from deepring.model.v41.vision import span_ids
from v41_helpers import make_pool, new_seqs, step, tiny_dict, tiny_model
from v41_reference import ReferenceV41, engram_tables_from_deepinfer

TOL = 1e-4
VOCAB = 512


@functools.lru_cache(maxsize=1)
def _reference() -> ReferenceV41:
    cfg = tiny_dict()
    tables = engram_tables_from_deepinfer(v41_oracle.deepinfer(), cfg["text_config"], VOCAB)
    return ReferenceV41(cfg, dict(tiny_model().named_parameters()), tables)


def _prompt(seed: int) -> tuple[list[int], dict[int, torch.Tensor]]:
    """Text, an image span (2 rows of 3 merged patches), text, a one-patch image, text; and
    the span rows' embeddings (random: what a vision tower would give)."""
    g = torch.Generator().manual_seed(seed)

    def text(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    ids = text(5) + span_ids(VOCAB, 3, 2) + text(4) + span_ids(VOCAB, 1, 1) + text(3)
    hidden = tiny_dict()["text_config"]["hidden_size"]
    embeds = {i: torch.randn(hidden, generator=g) for i, t in enumerate(ids) if t >= VOCAB}
    return ids, embeds


def _pieces(embeds: dict[int, torch.Tensor], lo: int, hi: int) -> list:
    """SeqChunk.embeds of the chunk holding positions lo..hi-1: (row, rows) per run."""
    out = []
    for i in range(lo, hi):
        if i in embeds:
            if out and out[-1][0] + len(out[-1][1]) == i - lo:
                out[-1] = (out[-1][0], torch.cat([out[-1][1], embeds[i][None]]))
            else:
                out.append((i - lo, embeds[i][None]))
    return out


def test_a_prompt_with_images_matches_the_reference():
    model = tiny_model()
    ids, embeds = _prompt(seed=3)
    want = _reference().logits(ids, embeds=embeds)
    chunk = new_seqs(1)[0].chunk(ids, logits="all")
    chunk.embeds = _pieces(embeds, 0, len(ids))
    got = step(model, make_pool(model), [chunk])
    assert (got.double() - want).abs().max() < TOL


@pytest.mark.parametrize("cut", [3, 5, 6, 9, 13, 14, 17, 20])
def test_chunked_prompts_with_images_equal_the_reference(cut):
    """Split at `cut` (before, at, inside and after the spans): each chunk carries the slices
    of the spans it holds; then two decode steps."""
    model = tiny_model()
    ids, embeds = _prompt(seed=4)
    nxt = [7, 11]
    want = _reference().logits(ids + nxt, embeds=embeds)
    pool, s = make_pool(model), new_seqs(1)[0]
    got = []
    for lo, hi in ((0, cut), (cut, len(ids))):
        c = s.chunk(ids[lo:hi], logits="all")
        c.embeds = _pieces(embeds, lo, hi)
        got.append(step(model, pool, [c]))
    got += [step(model, pool, [s.chunk([t])]) for t in nxt]
    assert (torch.cat(got).double() - want).abs().max() < TOL


def test_image_rows_need_exactly_their_embeddings():
    model = tiny_model()
    ids, embeds = _prompt(seed=5)
    pool = make_pool(model)
    c = new_seqs(1)[0].chunk(ids, logits="all")
    c.embeds = _pieces(embeds, 0, len(ids))[:1]  # the second image's row left out
    with pytest.raises(ValueError, match="cover exactly the image tokens"):
        step(model, pool, [c])
    hidden = tiny_dict()["text_config"]["hidden_size"]
    c.embeds = [*_pieces(embeds, 0, len(ids)), (0, torch.zeros(1, hidden))]  # a text row
    with pytest.raises(ValueError, match="cover exactly the image tokens"):
        step(model, pool, [c])
    c.embeds = [(5, torch.zeros(8, hidden + 1))]
    with pytest.raises(ValueError, match=r"must be \[rows, "):
        step(model, pool, [c])


def test_v4_refuses_image_embeddings():
    from deepring.model.batch import SeqChunk
    from deepring.model.loader import load_model
    from deepring.model.tiny import tiny_config

    model = load_model(tiny_config(), load_format="dummy", dtype="float32").model
    pool = make_pool(model, num_blocks=8, num_slots=2, block_size=128)
    chunk = SeqChunk([5, 6], 0, 0, [1], embeds=[(0, torch.zeros(1, 1))])
    batch = ForwardBatch.build([chunk], model.rope_tables(), 128, model.device)
    with pytest.raises(ValueError, match="no vision tower"):
        model(batch, pool)
