"""V4.1 checkpoints quantised as V4.1-Flash's are (FP8 e4m3 dense weights with 32x32 UE8M0 block
scales, quantization_config.weight_block_size; MXFP4 routed experts) load into the same model
as their dequantised reference (tests/engine/quant_helpers.py), and give its logits; a scale
whose grid is the V4 128x128 one is an error naming the tensor."""

from __future__ import annotations

import json

import pytest
import torch
from deepring.model.loader import load_model
from quant_helpers import quantize_fp8, write_quantised_v41
from safetensors.torch import save_file
from v41_helpers import make_pool, new_seqs, step, tiny_dict, tiny_model


@pytest.fixture(scope="module")
def quantised(tmp_path_factory):
    path = tmp_path_factory.mktemp("v41-fp8-fp4")
    tensors, reference = write_quantised_v41(tiny_model(seed=4), path, tiny_dict())
    return path, tensors, reference


def _logits(model, ids):
    pool = make_pool(model)
    return step(model, pool, [new_seqs(1)[0].chunk(ids)])


def test_a_quantised_v41_checkpoint_loads_as_its_dequantised_reference(quantised):
    path, tensors, reference = quantised
    assert any(t.dtype == torch.float8_e4m3fn for t in tensors.values())
    assert any(t.dtype == torch.uint8 for t in tensors.values())  # packed FP4 experts
    loaded = load_model(path, dtype="float32", progress=False).model
    state = loaded.state_dict()
    for name, want in reference.items():
        assert torch.equal(state[name], want), name
    twin = load_model(loaded.config, load_format="dummy", seed=9, dtype="float32").model
    twin.load_state_dict(reference)
    twin.decoder_keep = loaded.decoder_keep = 0
    ids = list(range(3, 60, 3))
    torch.testing.assert_close(_logits(loaded, ids), _logits(twin, ids), rtol=0, atol=0)


def test_a_v4_block_grid_in_a_v41_checkpoint_is_named(quantised, tmp_path):
    _, tensors, _ = quantised
    tensors = dict(tensors)
    name = "layers.2.attn.wq_a"
    w = tensors[name + ".weight"].float()
    q, scale, _ = quantize_fp8(w, 128)  # one 128x128 block where 32x32 ones are expected
    tensors[name + ".weight"], tensors[name + ".scale"] = q, scale
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(tiny_dict()), encoding="utf-8")
    with pytest.raises(ValueError, match=r"layers\.2\.attn\.wq_a.*32x32 block scale grid"):
        load_model(tmp_path, dtype="float32", progress=False)
