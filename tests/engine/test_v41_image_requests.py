"""Requests with images through the engine (core.images, the runner's span rows): the same
tokens and logits as one cold forward of the whole prompt with the tower's embeddings (the
model-level path test_v41_images.py checks against the fp64 reference), chunked anywhere; the
prefix cache hits a prefix with the same image and never one with another image of its size;
prompts that misplace a span are refused."""

from __future__ import annotations

import pytest
import torch
from deepring.core.images import PromptImage
from deepring.model.v41.vision import span_ids
from prefix_helpers import engine, params, run
from v41_helpers import make_pool, new_seqs, step, tiny_model

VOCAB = 512
GRIDS = [(4, 5), (2, 1)]  # patch grids: spans of 2 rows of 2 + ..., and of 1 row of 1


def _image(seed: int, n_w: int, n_h: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n_h * 14 - 3, n_w * 14 - 1, 3), generator=g, dtype=torch.uint8)


def _prompt(seeds: tuple[int, int], text_seed: int = 0) -> tuple[list[int], list[PromptImage]]:
    """40 text tokens (a shared prefix past two 16-token blocks), image 1, text, image 2, text."""
    model = tiny_model()
    g = torch.Generator().manual_seed(text_seed)
    ids: list[int] = torch.randint(3, VOCAB, (40,), generator=g).tolist()
    images = []
    for seed, (n_w, n_h) in zip(seeds, GRIDS, strict=True):
        cols, rows = model.vision_config.merged(n_w, n_h)
        images.append(PromptImage.of(len(ids), _image(seed, n_w, n_h), n_w, n_h))
        ids += span_ids(VOCAB, cols, rows) + torch.randint(3, VOCAB, (5,), generator=g).tolist()
    return ids, images


def _cold(ids: list[int], images: list[PromptImage], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and their logits from whole-prompt forwards, with the tower's embeddings."""
    model = tiny_model()
    spans = model.embed_images([(im.pixels, im.n_w, im.n_h) for im in images])
    pool, s = make_pool(model), new_seqs(1, blocks_each=16)[0]
    c = s.chunk(ids)
    c.embeds = [(im.start, e) for im, e in zip(images, spans, strict=True)]
    logits = [step(model, pool, [c])[-1]]
    out = [int(logits[-1].argmax())]
    for _ in range(n - 1):
        logits.append(step(model, pool, [s.chunk([out[-1]])])[-1])
        out.append(int(logits[-1].argmax()))
    return out, torch.stack(logits)


@pytest.mark.parametrize("budget", [2048, 13, 7])
def test_engine_output_equals_a_cold_forward_however_the_prompt_is_chunked(budget):
    ids, images = _prompt((1, 2))
    want, want_logits = _cold(ids, images, 6)
    eng, rec = engine(tiny_model(), budget=budget)
    out, _, logits = run(eng, rec, None, ids, params(6), images=images)
    assert out == want
    torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-4)
    assert all(not r.image_embeds for r in eng.requests.values())  # none kept past prefill


def test_the_prefix_cache_keys_images_by_their_pixels():
    ids, images = _prompt((1, 2))
    eng, rec = engine(tiny_model(), replay="exact")
    first, hit, _ = run(eng, rec, None, ids, params(6), images=images)
    assert hit == 0
    again, hit, _ = run(eng, rec, None, ids, params(6), images=images)
    assert again == first
    assert hit >= 48  # past the first image (its span starts at 40)
    # Another first image of the same size: the same ids, but no hit past the text before it.
    other_ids, other = _prompt((3, 2))
    assert other_ids == ids
    out, hit, logits = run(eng, rec, None, other_ids, params(6), images=other)
    assert hit <= 32  # the whole blocks before position 40
    want, want_logits = _cold(other_ids, other, 6)
    assert out == want
    torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-4)


def test_misplaced_spans_and_models_without_a_tower_are_refused():
    ids, images = _prompt((1, 2))
    eng, _ = engine(tiny_model())
    moved = [PromptImage.of(images[0].start + 1, images[0].pixels, 4, 5), images[1]]
    with pytest.raises(ValueError, match="does not hold its span"):
        eng.add(1, ids, params(), 5, images=moved)
    with pytest.raises(ValueError, match=r"out of range \[0, 512\)"):
        eng.add(2, ids, params(), 5, images=images[:1])  # the second span unaccounted for
    small = [PromptImage.of(images[0].start, _image(1, 5, 5), 4, 5), images[1]]
    with pytest.raises(ValueError, match="does not fit"):
        eng.add(3, ids, params(), 5, images=small)
    with pytest.raises(ValueError, match="inside the one before"):
        eng.add(4, ids, params(), 5, images=[images[0], images[0]])
    with pytest.raises(ValueError, match="uint8"):
        PromptImage.of(0, torch.zeros(4, 4, 3), 1, 1)

    # A V4.1 checkpoint without the tower's tensors (DeepseekV41.drop_vision).
    from deepring.model.config import ModelConfig
    from deepring.model.loader import load_model
    from v41_helpers import tiny_dict

    text_only = load_model(ModelConfig.from_hf_dict(tiny_dict()), load_format="dummy",
                           dtype="float32").model  # fmt: skip
    text_only.drop_vision()
    eng2, _ = engine(text_only)
    with pytest.raises(ValueError, match="no vision tower"):
        eng2.add(5, ids, params(), 5, images=images)
