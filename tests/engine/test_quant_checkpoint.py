"""Quantised checkpoints: a tiny model quantised here exactly as DeepSeek's official layout
(FP8 e4m3 dense weights with 128x128 UE8M0 block scales, MXFP4 routed experts: E2M1 pairs per
byte with a UE8M0 scale per 32 inputs) loads into the same model as its dequantised reference,
within the formats' error of the original weights; malformed scales and shapes are errors."""

from __future__ import annotations

import pytest
import torch
from deepring.model.loader import load_model
from quant_helpers import write_quantised_v4
from safetensors.torch import save_file
from v4_helpers import model_config, ours, prefill_logits


@pytest.fixture(scope="module")
def quantised(tmp_path_factory):
    model = ours(model_config("swa-csa-hca"), seed=5)
    path = tmp_path_factory.mktemp("fp8-fp4")
    tensors, reference = write_quantised_v4(model, path)
    return model, path, tensors, reference


def test_quantised_checkpoint_loads_as_its_dequantised_reference(quantised):
    original, path, _, reference = quantised
    loaded = load_model(path, dtype="float32", progress=False).model
    state = loaded.state_dict()
    for name, want in reference.items():
        assert torch.equal(state[name], want), name
    # Within the formats' error of the unquantised weights: FP8 e4m3 rounds to 3 mantissa bits
    # (relative 2^-4, subnormals 2^-10 of the block scale); E2M1 to at most a quarter of the
    # larger of the value and its group's scale.
    orig = original.state_dict()
    gate_up = "model.layers.1.mlp.experts.gate_up_proj"
    err = (state[gate_up] - orig[gate_up]).abs()
    assert bool((err <= 0.25 * orig[gate_up].abs() + 0.25 * orig[gate_up].abs().amax()).all())
    assert err.max() > 0  # FP4 did round
    q_a = "model.layers.0.self_attn.q_a_proj.weight"
    err = (state[q_a] - orig[q_a]).abs()
    assert bool((err <= 2**-4 * orig[q_a].abs() + 2**-10 * orig[q_a].abs().max()).all())
    # The same logits as a model holding the dequantised weights directly.
    twin = ours(model_config("swa-csa-hca"), seed=5)
    twin.load_state_dict(reference, strict=False)
    ids = list(range(3, 40, 2))
    torch.testing.assert_close(prefill_logits(loaded, ids), prefill_logits(twin, ids))


def _rewrite(quantised, tmp_path, edit):
    _, path, tensors, _ = quantised
    tensors = dict(tensors)
    edit(tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    return tmp_path


FP8_NAME = "model.layers.0.self_attn.q_a_proj"
FP4_NAME = "model.layers.1.mlp.experts.3.w2"


def _nan_scale(t):
    s = t[FP8_NAME + ".scale"].view(torch.uint8).clone()
    s[0, 0] = 255
    t[FP8_NAME + ".scale"] = s.view(torch.float8_e8m0fnu)


MALFORMED = {
    "fp8 scale grid": (
        lambda t: t.update({FP8_NAME + ".scale": torch.ones(2, 1).to(torch.float8_e8m0fnu)}),
        r"block scale grid of shape \(1, 1\)",
    ),
    "fp8 nan scale": (_nan_scale, "NaN code"),
    "fp8 without scale": (lambda t: t.pop(FP8_NAME + ".scale"), "without a scale"),
    "scale without weight": (lambda t: t.pop(FP8_NAME + ".weight"), "scales without a quantised"),
    "fp8 scale dtype": (
        lambda t: t.update({FP8_NAME + ".scale": torch.ones(1, 1, dtype=torch.float16)}),
        "expected UE8M0",
    ),
    "fp8 weight shape": (
        lambda t: t.update({FP8_NAME + ".weight": t[FP8_NAME + ".weight"][:, :-1].contiguous()}),
        "has shape",
    ),
    "mxfp4 scale shape": (
        lambda t: t.update({FP4_NAME + ".scale": t[FP4_NAME + ".scale"][:, :-1].contiguous()}),
        "one per 32 inputs",
    ),
    "mxfp4 weight shape": (
        lambda t: t.update({FP4_NAME + ".weight": t[FP4_NAME + ".weight"][:-1].contiguous()}),
        "need a scale of shape",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_quantised_checkpoints_are_clear_errors(quantised, tmp_path, case):
    edit, match = MALFORMED[case]
    path = _rewrite(quantised, tmp_path, edit)
    with pytest.raises(ValueError, match=match):
        load_model(path, dtype="float32", progress=False)
