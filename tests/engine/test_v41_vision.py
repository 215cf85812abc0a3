"""The V4.1 vision tower (model.v41.vision) against DeepInfer 0.1.0's own code
(v41_vision_oracle), its checkpoint names, and its place in the V4.1 checkpoint."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from deepring.model.config import ModelConfig
from deepring.model.v41.model import DeepseekV41
from deepring.model.v41.tiny import V41_TINY_CONFIG
from deepring.model.v41.vision import (
    Aligner,
    VisionConfig,
    VisionTower,
    embed_images,
    image_patches,
)
from deepring.model.v41.weights import init_dummy_v41, load_v41_checkpoint, save_v41_checkpoint

TINY_VISION = {"hidden_size": 64, "depth": 2, "num_heads": 4, "patch_size": 14,
               "downsample_ratio": 3}  # fmt: skip
# (patch columns, rows, pixel width, height): merged groups whole and ragged, one-row and
# one-column grids, images smaller than their canvas (centred, odd margins) and filling it.
IMAGES = [(5, 7, 61, 95), (3, 3, 42, 42), (1, 4, 9, 50), (8, 2, 111, 28), (4, 4, 56, 55)]


def _random_weights(*modules: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in modules:
            for name, p in m.named_parameters():
                if "norm" in name:
                    p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def test_the_tower_equals_deepinfers_vision_pipeline():
    from v41_vision_oracle import vision

    o = vision()
    cfg = VisionConfig.from_dict(TINY_VISION, text_hidden=48)
    assert cfg.intermediate == 256  # DeepInfer's sizing: 128 * ceil(int(64 * 2.7) / 128)
    tower, aligner = VisionTower(cfg), Aligner(cfg)
    special = tuple(torch.randn(3, 48, generator=torch.Generator().manual_seed(1)))
    _random_weights(tower, aligner)

    o.vit.EMBED_DIM, o.vit.DEPTH, o.vit.NUM_HEADS = 64, 2, 4
    vt = o.vit.VisionTransformer(recomputing_every_layer=2)
    proj = o.MlpProjector(o.AttrDict(projector_type="downsample_mlp_gelu", input_dim=64,
                                     hidden_size=48, depth=2, downsample_ratio=3))  # fmt: skip
    # Every oracle tensor filled from ours through DeepInfer's checkpoint-name mapping.
    for ours, prefix, theirs in ((tower, "vision.", vt), (aligner, "aligner.", proj)):
        target = theirs.state_dict()
        filled = set()
        for name, t in ours.state_dict().items():
            internal = o.hf_to_model(prefix + name, n_layer=1)
            key = internal.split(".aligner.visual_encoder.", 1)[-1].split(".aligner.aligner.")[-1]
            assert target[key].shape == t.shape, key
            target[key] = t
            filled.add(key)
        assert filled == set(target)
        theirs.load_state_dict(target)

    gen = torch.Generator().manual_seed(2)
    pixels = [torch.randint(0, 256, (h, w, 3), generator=gen, dtype=torch.uint8)
              for _, _, w, h in IMAGES]  # fmt: skip
    grids = [(px, nw, nh) for px, (nw, nh, _, _) in zip(pixels, IMAGES, strict=True)]
    ours = embed_images(tower, aligner, special, grids)

    crops = torch.tensor([[nw, nh] for nw, nh, _, _ in IMAGES])
    lens = [nw * nh for nw, nh, _, _ in IMAGES]
    cu_vit = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    raw = torch.cat([px.reshape(-1) for px in pixels])
    cu_raw = torch.tensor([0, *torch.tensor([px.numel() for px in pixels]).cumsum(0).tolist()])
    sizes = torch.tensor([[w, h] for _, _, w, h in IMAGES])
    pad_color = float(int(0.5 * 255))  # deepseek_vl.derive_image_transform_cfg
    patches = o.rgb_pad_to_patches_ref(raw, cu_raw, sizes, crops, cu_vit, sum(lens), 14,
                                       0.5, 0.5, pad_color)  # fmt: skip
    layouts = [o.load_image_anyres((nw * 14, nh * 14), 14, 3, 1024) for nw, nh, _, _ in IMAGES]
    for lay, (nw, nh, _, _) in zip(layouts, IMAGES, strict=True):
        assert lay[3].tolist() == [[nw, nh]]
        assert lay[0] == cfg.span_tokens(nw, nh)
    pos = torch.cat([lay[4] for lay in layouts])
    with torch.no_grad():
        feats = vt(patches.float(), pos, cu_vit, max(lens))
        merged = proj.layers(o.batch_downsample_ref(feats, crops, 3))
    T = o.TokenType
    vectors = {T.IMAGE_START: special[0], T.IMAGE_NEW_LINE: special[1], T.IMAGE_END: special[2]}
    rows = iter(merged)
    for lay, span in zip(layouts, ours, strict=True):
        expect = torch.stack([next(rows) if int(t) == T.IMAGE else vectors[int(t)] for t in lay[5]])
        assert span.shape == expect.shape
        torch.testing.assert_close(span, expect, atol=2e-5, rtol=1e-4)
    assert next(rows, None) is None


def test_pixels_must_be_rgb_bytes_that_fit_their_canvas():
    cfg = VisionConfig.from_dict(TINY_VISION, text_hidden=48)
    with pytest.raises(ValueError, match="does not fit"):
        image_patches(torch.zeros(29, 10, 3, dtype=torch.uint8), 1, 2, cfg)
    with pytest.raises(ValueError, match="uint8"):
        image_patches(torch.zeros(10, 10, 3), 1, 1, cfg)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        VisionConfig.from_dict({**TINY_VISION, "num_heads": 3}, text_hidden=48)


def _tiny(vision: dict | None):
    cfg = copy.deepcopy(V41_TINY_CONFIG)
    if vision is None:
        cfg.pop("vision_config")
    return cfg, DeepseekV41(ModelConfig.from_hf_dict(cfg))


def test_the_language_model_weights_do_not_depend_on_the_tower():
    _, with_tower = _tiny(V41_TINY_CONFIG["vision_config"])
    _, without = _tiny(None)
    init_dummy_v41(with_tower, 0)
    init_dummy_v41(without, 0)
    theirs = dict(without.named_parameters())
    names = [n for n, _ in with_tower.named_parameters() if n in theirs]
    assert len(names) == len(theirs)
    for n in names:
        assert torch.equal(dict(with_tower.named_parameters())[n], theirs[n]), n
    assert with_tower.vision_config is not None
    assert without.vision_config is None


def test_a_checkpoint_loads_with_its_tower_without_one_or_refuses_half_of_one(tmp_path):
    cfg, model = _tiny(V41_TINY_CONFIG["vision_config"])
    init_dummy_v41(model, 0)
    save_v41_checkpoint(model, tmp_path / "full", cfg)
    _, loaded = _tiny(V41_TINY_CONFIG["vision_config"])
    load_v41_checkpoint(loaded, tmp_path / "full", progress=False)
    assert torch.equal(loaded.vision.blocks[1].mlp.w1.weight, model.vision.blocks[1].mlp.w1.weight)
    assert torch.equal(loaded.image_newline, model.image_newline)
    img = [(torch.randint(0, 256, (30, 40, 3), dtype=torch.uint8), 3, 3)]
    assert torch.equal(loaded.embed_images(img)[0], model.embed_images(img)[0])

    # Without the tower's tensors: text only (the tower is dropped, images are refused).
    _, text_only = _tiny(None)
    init_dummy_v41(text_only, 0)
    save_v41_checkpoint(text_only, tmp_path / "text", cfg)  # the config still names a tower
    _, loaded = _tiny(V41_TINY_CONFIG["vision_config"])
    load_v41_checkpoint(loaded, tmp_path / "text", progress=False)
    assert loaded.vision_config is None
    assert not hasattr(loaded, "aligner")
    with pytest.raises(ValueError, match="no vision tower"):
        loaded.embed_images(img)

    # Half a tower is an error naming what is missing.
    from safetensors.torch import load_file, save_file

    st = tmp_path / "full" / "model.safetensors"
    tensors = load_file(st)
    del tensors["aligner.w2.weight"]
    save_file(tensors, st)
    _, loaded = _tiny(V41_TINY_CONFIG["vision_config"])
    with pytest.raises(ValueError, match=r"aligner\.w2\.weight"):
        load_v41_checkpoint(loaded, tmp_path / "full", progress=False)
    assert json.loads((tmp_path / "text" / "config.json").read_text())["vision_config"]
