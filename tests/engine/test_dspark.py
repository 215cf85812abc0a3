"""The DSpark drafter's plain forward (model.dspark) against the paper's equations written out
here, and its stage math against the engine's decoder layer; its config keys and checkpoint
names."""

from __future__ import annotations

import json
import math

import pytest
import torch
from deepring.model.batch import ForwardBatch, SeqChunk
from deepring.model.config import ModelConfig
from deepring.model.dspark import _block_mask, _hc_pre, _kv, _rms, _stage
from deepring.model.loader import load_model
from deepring.model.presets import V4_FLASH
from deepring.model.weights import save_checkpoint
from v4_helpers import CONFIGS, pool_for

DSPARK = {
    "dspark_block_size": 4,
    "dspark_noise_token_id": 500,
    "dspark_target_layer_ids": [1, 2, 3],
    "dspark_markov_rank": 8,
    "dspark_num_stages": 2,
    "dspark_n_routed_experts": 4,
    "dspark_num_experts_per_tok": 2,
}


def _model(seed: int = 3, **over):
    config = ModelConfig.from_hf_dict({**CONFIGS["swa-csa-hca"], **DSPARK, **over})
    return load_model(config, load_format="dummy", seed=seed, dtype="float32", progress=False)


def test_config_reads_the_published_dspark_keys():
    ratios = V4_FLASH["compress_ratios"] + [0, 0]  # 46 entries for 43 layers, as published
    d = {**V4_FLASH, "compress_ratios": ratios, "dspark_block_size": 5,
         "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [40, 41, 42],
         "dspark_markov_rank": 256}  # fmt: skip
    config = ModelConfig.from_hf_dict(d)
    ds = config.dspark
    assert ds is not None
    assert (ds.block_size, ds.noise_token_id, ds.target_layer_ids) == (5, 128799, (40, 41, 42))
    # num_nextn_predict_layers says 1 (stale); the trailing ratios say 3 stages.
    assert ds.num_stages == 3
    assert config.num_nextn_predict_layers == 3
    assert (ds.n_routed_experts, ds.num_experts_per_tok) == (256, 6)
    assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config
    assert ModelConfig.from_hf_dict(V4_FLASH).dspark is None
    with pytest.raises(ValueError, match="dspark_target_layer_ids"):
        ModelConfig.from_hf_dict({**d, "dspark_target_layer_ids": [40, 43]})
    with pytest.raises(ValueError, match="sliding-only"):
        ModelConfig.from_hf_dict({**d, "compress_ratios": [*ratios[:-1], 4]})


def test_block_mask_is_window_before_anchor_plus_own_block():
    anchors = torch.tensor([[1, 7, 20], [3, 3, 25]])
    s, g, window = 22, 3, 5
    got = _block_mask(anchors, s, g, window)
    b, a = anchors.shape
    want = torch.zeros(b, a * g, s + a * g, dtype=torch.bool)
    for bi in range(b):
        for ai in range(a):
            p = int(anchors[bi, ai])
            for k in range(g):
                row = ai * g + k
                for j in range(s):  # the context: the window's taps before the anchor
                    want[bi, row, j] = p - window <= j < p
                for k2 in range(g):  # the whole block, both directions
                    want[bi, row, s + ai * g + k2] = True
    assert torch.equal(got, want)


def test_markov_correction_and_confidence_match_the_equations():
    net = _model().model
    drafter = net.mtp
    g, d = drafter.ds.block_size, net.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, g, d, generator=gen)
    anchor = torch.tensor([4, 77, 300])
    head = net.lm_head.weight
    w1 = drafter.last.markov_head.embed.weight
    w2 = drafter.last.markov_head.head.weight
    w = drafter.last.confidence_head.proj.weight[0]
    toks, logits, conf = drafter.draft_greedy(hidden, anchor, head)
    for r in range(3):
        prev = int(anchor[r])
        survive = 1.0
        for k in range(g):
            u = head @ hidden[r, k]  # U_k
            corrected = u + w2 @ w1[prev]  # logits'_k = U_k + W2 W1[x_{k-1}]
            torch.testing.assert_close(logits[r, k], corrected, atol=1e-4, rtol=1e-5)
            z = w @ torch.cat([hidden[r, k], w1[prev]])  # c_k = sigmoid(w . [h_k ; W1[x_{k-1}]])
            torch.testing.assert_close(conf[r, k], z, atol=1e-5, rtol=1e-5)
            survive *= 1 / (1 + math.exp(-float(z)))
            assert math.isclose(float(drafter.survival(conf)[r, k]), survive, rel_tol=1e-5)
            prev = int(corrected.argmax())
            assert int(toks[r, k]) == prev


def test_block_sees_only_its_window_and_its_own_block():
    net = _model().model
    drafter, embed = net.mtp, net.model.embed_tokens
    window = net.config.sliding_window  # 8
    gen = torch.Generator().manual_seed(1)
    taps = torch.randn(1, 30, 3, net.config.hidden_size, generator=gen)
    ids = torch.tensor([[11, 12, 13]])
    pos = torch.tensor([[2, 15, 30]])
    with torch.no_grad():
        base = drafter.block_hidden(taps, ids, pos, embed)
        alone = drafter.block_hidden(taps, ids[:, 1:2], pos[:, 1:2], embed)
        torch.testing.assert_close(alone[:, 0], base[:, 1], atol=1e-5, rtol=0)
        outside = taps.clone()
        outside[:, : 15 - window] += 5  # before block 1's window: it must not notice
        outside[:, 15:] += 5  # at or after its anchor: neither
        torch.testing.assert_close(
            drafter.block_hidden(outside, ids, pos, embed)[:, 1], base[:, 1], atol=1e-5, rtol=0
        )
        inside = taps.clone()
        inside[:, 14] += 5
        changed = drafter.block_hidden(inside, ids, pos, embed)
    assert not torch.allclose(changed[:, 1], base[:, 1], atol=1e-3)
    torch.testing.assert_close(changed[:, 0], base[:, 0], atol=1e-5, rtol=0)


def test_stage_math_equals_the_engine_sliding_layer():
    """With one-row blocks whose context is the same normalised inputs, a stage's plain forward
    is exactly a sliding-window decoder layer: the engine's layer (kernels, paged ring) computes
    the same streams, so hyper-connections, attention, sinks, RoPE and MoE agree."""
    net = _model(seed=4).model
    stage = net.mtp[0]
    n, window = net.config.num_hidden_layers, net.config.sliding_window
    t = 21
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(t, net.config.hc_mult, net.config.hidden_size, generator=gen)
    ids = torch.randint(0, 400, (t,), generator=gen)
    pool = pool_for(net, num_blocks=8, block_size=16)
    batch = ForwardBatch.build(
        [SeqChunk(ids.tolist(), 0, 0, [1, 2], logits="all")], net.rope_tables(), 16, net.device
    )
    with torch.inference_mode():
        want = stage(h.clone(), ids, batch, pool.layers[n])
    with torch.no_grad():
        x = _rms(_hc_pre(stage.attn_hc, h[None])[2], stage.input_layernorm)
        cs = tuple(c[None] for c in net.mtp.rope().cos_sin(torch.arange(t), "main"))
        ctx_kv = _kv(stage, x, cs)
        # Row p sees the window - 1 rows before it and itself: the engine's window of p.
        mask = _block_mask(torch.arange(t)[None], t, 1, window - 1)
        got = _stage(stage, h[None], ctx_kv, cs, mask)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_original_checkpoint_names_load(tmp_path):
    """A checkpoint in DeepSeek's layout (`mtp.S.attn.wq_a`, `mtp.S.hc_head_fn`,
    `mtp.S.markov_head.embed`, per-expert w1/w2/w3) fills every drafter tensor."""
    src = _model(seed=5)
    state = {k: v for k, v in src.model.state_dict().items() if not k.endswith("inv_freq")}
    original = {}
    for k, v in state.items():
        if not k.startswith("mtp."):
            original[k] = v
            continue
        name = (k.replace(".self_attn.", ".attn.").replace(".mlp.", ".ffn.")
                .replace("q_a_proj", "wq_a").replace("q_b_proj", "wq_b")
                .replace("kv_proj", "wkv").replace("o_a_proj", "wo_a").replace("o_b_proj", "wo_b")
                .replace("q_a_norm", "q_norm").replace("input_layernorm", "attn_norm")
                .replace("post_attention_layernorm", "ffn_norm").replace(".sinks", ".attn_sink")
                .replace("attn_hc.fn", "hc_attn_fn").replace("attn_hc.base", "hc_attn_base")
                .replace("attn_hc.scale", "hc_attn_scale").replace("ffn_hc.fn", "hc_ffn_fn")
                .replace("ffn_hc.base", "hc_ffn_base").replace("ffn_hc.scale", "hc_ffn_scale")
                .replace("hc_head.hc_", "hc_head_").replace("gate.e_score_correction_bias",
                                                            "gate.bias"))  # fmt: skip
        if name.endswith("experts.gate_up_proj"):
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                original[name.replace("gate_up_proj", f"{e}.w1.weight")] = v[e, :inter]
                original[name.replace("gate_up_proj", f"{e}.w3.weight")] = v[e, inter:]
            continue
        if name.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                original[name.replace("down_proj", f"{e}.w2.weight")] = v[e]
            continue
        original[name] = v
    assert "mtp.1.markov_head.embed.weight" in original
    assert "mtp.0.main_proj.weight" in original
    assert "mtp.1.hc_head_fn" in original
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in original.items()}, str(tmp_path / "m.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(src.config.to_hf_dict()))
    loaded = load_model(tmp_path, dtype="float32", progress=False)
    assert loaded.config.dspark == src.config.dspark
    for k, v in loaded.model.state_dict().items():
        if k.startswith("mtp."):
            assert torch.equal(v, state[k]), k


def test_checkpoint_without_drafter_tensors_drops_it(tmp_path):
    src = _model(seed=6)
    save_checkpoint(src.model, tmp_path, src.config.to_hf_dict())
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.startswith("mtp.")},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    loaded = load_model(tmp_path, dtype="float32", progress=False)
    assert loaded.config.dspark is None
    assert len(loaded.model.mtp) == 0
