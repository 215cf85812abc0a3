"""Config parsing and checkpoint loading: both tensor layouts, coverage and shape validation,
MTP handling, dummy weights, the dtype policy."""

from __future__ import annotations

import re

import pytest
import torch
from deepring.model.config import CSA, HASH_MOE, HCA, MOE, SLIDING, ModelConfig
from deepring.model.loader import load_model
from deepring.model.presets import V4_FLASH
from deepring.model.weights import save_checkpoint
from safetensors.torch import load_file, save_file
from v4_helpers import CONFIGS, hf_config, model_config, ours, prefill_logits


def test_v4_flash_config_parses_like_transformers():
    ours_cfg = ModelConfig.from_hf_dict(V4_FLASH)
    from transformers import DeepseekV4Config

    ref = DeepseekV4Config(**{k: v for k, v in V4_FLASH.items() if k != "model_type"})
    assert list(ours_cfg.layer_types) == ref.layer_types
    assert list(ours_cfg.mlp_layer_types) == ref.mlp_layer_types
    assert ours_cfg.rope_head_dim == ref.qk_rope_head_dim == 64
    assert ours_cfg.layer_types[:2] == (SLIDING, SLIDING)
    assert ours_cfg.layer_types.count(CSA) == 21
    assert ours_cfg.layer_types.count(HCA) == 20
    assert ours_cfg.mlp_layer_types[:4] == (HASH_MOE, HASH_MOE, HASH_MOE, MOE)
    assert ours_cfg.mtp_layer_types == (SLIDING,)
    assert ours_cfg.yarn is not None
    assert ours_cfg.yarn.factor == ref.rope_parameters["compress"]["factor"] == 16
    assert ours_cfg.min_block_size() == 128


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_round_trips_through_transformers(name):
    cfg = model_config(name)
    ref = hf_config(cfg)
    again = ModelConfig.from_hf_dict(ref.to_dict())
    assert again.layer_types == cfg.layer_types
    assert again.mlp_layer_types == cfg.mlp_layer_types
    assert again.compress_rates == cfg.compress_rates
    assert again.rope_head_dim == cfg.rope_head_dim
    assert again.yarn == cfg.yarn


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"layer_types": [SLIDING]}, "layer_types"),
        ({"scoring_func": "relu"}, "scoring_func"),
        ({"model_type": "llama"}, "model_type"),
        ({"compress_ratios": [0, 7, 0, 0], "layer_types": None}, "ratio 7"),
    ],
)
def test_bad_configs_are_rejected(change, match):
    d = {**CONFIGS["swa-csa-hca"], **change}
    d = {k: v for k, v in d.items() if v is not None}
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_dict(d)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Our dummy model with an MTP layer, saved in the engine's (= transformers') naming."""
    cfg = model_config("swa-csa-hca", num_nextn_predict_layers=1)
    model = ours(cfg, seed=4)
    path = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(model, path, cfg.to_hf_dict())
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    return path, model, ids, prefill_logits(model, ids)


def _rewrite(src, dst, edit) -> None:
    tensors = load_file(str(src / "model.safetensors"))
    dst.mkdir(exist_ok=True)
    save_file(edit(tensors), str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())


def test_saved_checkpoint_round_trips(saved):
    path, model, ids, ref = saved
    loaded = load_model(path, dtype="float32", progress=False)
    assert len(loaded.model.mtp) == 1
    for (n, a), (_, b) in zip(
        loaded.model.state_dict().items(), model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), n
    torch.testing.assert_close(prefill_logits(loaded.model, ids), ref, atol=0, rtol=0)


def _to_original_names(tensors: dict) -> dict:
    """DeepSeek's original checkpoint naming, written out independently of the loader."""
    out = {}
    leaf = [
        (r"^model\.embed_tokens\.weight$", "embed.weight"),
        (r"^lm_head\.weight$", "head.weight"),
        (r"^model\.norm\.weight$", "norm.weight"),
        (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
        (r"^model\.", ""),
        (r"\.hc_head\.hc_(fn|base|scale)$", r".hc_head_\1"),
        (
            r"\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.",
            ".attn.indexer.weights_proj.",
        ),
        (r"\.self_attn\.compressor\.indexer\.q_b_proj\.", ".attn.indexer.wq_b."),
        (r"\.self_attn\.compressor\.indexer\.", ".attn.indexer.compressor."),
        (r"\.self_attn\.", ".attn."),
        (r"\.mlp\.", ".ffn."),
        (r"\.(attn_hc|ffn_hc)\.(fn|base|scale)$", lambda m: f".hc_{m[1][:-3]}_{m[2]}"),
        (r"\.input_layernorm\.", ".attn_norm."),
        (r"\.post_attention_layernorm\.", ".ffn_norm."),
        (r"\.sinks$", ".attn_sink"),
        (r"\.position_bias$", ".ape"),
        (r"(compressor)\.kv_norm\.", r"\1.norm."),
        (r"\.q_a_proj\.", ".wq_a."),
        (r"\.attn\.q_b_proj\.", ".attn.wq_b."),
        (r"\.kv_proj\.", ".wkv."),
        (r"\.gate_proj\.", ".wgate."),
        (r"\.o_a_proj\.", ".wo_a."),
        (r"\.o_b_proj\.", ".wo_b."),
        (r"\.q_a_norm\.", ".q_norm."),
        (r"\.e_score_correction_bias$", ".bias"),
        (r"\.shared_experts\.wgate\.", ".shared_experts.w1."),
        (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),
        (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."),
    ]
    for name, t in tensors.items():
        if name.endswith("experts.gate_up_proj"):
            base = re.sub(r"^model\.", "", name[: -len(".gate_up_proj")]).replace(".mlp.", ".ffn.")
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}.{e}.w1.weight"] = t[e, :inter].clone()
                out[f"{base}.{e}.w3.weight"] = t[e, inter:].clone()
            continue
        if name.endswith("experts.down_proj"):
            base = re.sub(r"^model\.", "", name[: -len(".down_proj")]).replace(".mlp.", ".ffn.")
            for e in range(t.shape[0]):
                out[f"{base}.{e}.w2.weight"] = t[e].clone()
            continue
        new = name
        for pat, rep in leaf:
            new = re.sub(pat, rep, new)
        out[new] = t
    return out


def test_original_deepseek_layout_loads(saved, tmp_path):
    path, _, ids, ref = saved
    _rewrite(path, tmp_path, _to_original_names)
    names = load_file(str(tmp_path / "model.safetensors")).keys()
    assert "layers.1.attn.indexer.compressor.ape" in names
    assert "mtp.0.hc_attn_fn" in names
    assert "layers.2.ffn.experts.3.w2.weight" in names
    loaded = load_model(tmp_path, dtype="float32", progress=False)
    assert len(loaded.model.mtp) == 1
    torch.testing.assert_close(prefill_logits(loaded.model, ids), ref, atol=0, rtol=0)


def test_missing_tensor_is_named(saved, tmp_path):
    path = saved[0]
    _rewrite(
        path,
        tmp_path,
        lambda t: {k: v for k, v in t.items() if "layers.2.self_attn.sinks" not in k},
    )
    with pytest.raises(ValueError, match=r"model\.layers\.2\.self_attn\.sinks"):
        load_model(tmp_path, progress=False)


def test_misshapen_tensor_is_named(saved, tmp_path):
    path = saved[0]

    def edit(t):
        t["model.layers.1.self_attn.q_b_proj.weight"] = torch.zeros(3, 3)
        return t

    _rewrite(path, tmp_path, edit)
    with pytest.raises(ValueError, match=r"q_b_proj\.weight.*shape \(3, 3\)"):
        load_model(tmp_path, progress=False)


def test_unexpected_tensor_is_named(saved, tmp_path):
    _rewrite(saved[0], tmp_path, lambda t: {**t, "model.layers.0.bogus": torch.zeros(1)})
    with pytest.raises(ValueError, match="bogus"):
        load_model(tmp_path, progress=False)


def test_partial_mtp_is_an_error_absent_mtp_disables_it(saved, tmp_path):
    path = saved[0]
    _rewrite(
        path, tmp_path / "a", lambda t: {k: v for k, v in t.items() if "mtp.0.e_proj" not in k}
    )
    with pytest.raises(ValueError, match=r"mtp\.0\.e_proj"):
        load_model(tmp_path / "a", progress=False)
    _rewrite(
        path, tmp_path / "b", lambda t: {k: v for k, v in t.items() if not k.startswith("mtp.")}
    )
    loaded = load_model(tmp_path / "b", progress=False)
    assert len(loaded.model.mtp) == 0
    assert loaded.config.num_nextn_predict_layers == 0


def test_a_scale_beside_an_unquantised_weight_is_an_error(saved, tmp_path):
    """(Quantised checkpoints proper: test_quant_checkpoint.)"""

    def edit(t):
        t["model.layers.0.self_attn.q_a_proj.scale"] = torch.ones(1, 1, dtype=torch.bfloat16)
        return t

    _rewrite(saved[0], tmp_path, edit)
    with pytest.raises(ValueError, match=r"scales without a quantised .* weight"):
        load_model(tmp_path, progress=False)


def test_dummy_weights_are_seeded():
    cfg = model_config("hca-bootstrap")
    a = ours(cfg, seed=1).state_dict()
    b = ours(cfg, seed=1).state_dict()
    c = ours(cfg, seed=2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])
    tid = a["model.layers.1.mlp.gate.tid2eid"]
    assert all(len(set(row.tolist())) == tid.shape[1] for row in tid)  # distinct experts


def test_bf16_keeps_the_fp32_tensors_fp32():
    model = load_model(model_config("swa-csa-hca"), load_format="dummy", dtype="bfloat16").model
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["model.layers.0.attn_hc.fn"] == torch.float32
    assert dtypes["model.layers.1.self_attn.sinks"] == torch.float32
    assert dtypes["model.layers.1.self_attn.compressor.position_bias"] == torch.float32
    assert dtypes["model.norm.weight"] == torch.float32
    assert dtypes["model.layers.0.self_attn.q_a_norm.weight"] == torch.float32
    assert dtypes["model.layers.0.self_attn.q_a_proj.weight"] == torch.bfloat16
    assert dtypes["lm_head.weight"] == torch.bfloat16
