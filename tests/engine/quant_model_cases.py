"""A tiny V4 and a tiny V4.1 checkpoint in the official quantised layout (FP8 e4m3 dense weights
with UE8M0 block scales, MXFP4 routed experts: quant_helpers), each loaded twice: dequantised at
load (the reference: exactly what the engine did before weights were kept) and kept quantised
(model.linear.Linear and kernels.moe.moe_experts_mxfp4 over kernels.quant_gemm). Prefill and
decode logits must agree and greedy tokens be the same.

Not collected by the main run: test_quant_model.py runs this file in a subprocess under
TRITON_INTERPRET=1 on CPU (set before triton is imported) and on a CUDA device when there is one.

Tolerance: both models hold the same fp32 values (FP8 / E2M1 times a power of two is exact in
fp32), and the kernels multiply and accumulate in fp32 (input_precision="ieee"), so the two
differ only in summation order: ~1e-7 relative per GEMM, grown through four layers, norms and
softmaxes. 1e-4 of the logits' scale leaves two orders of margin over that and is still far
below any real decoding error (an FP8 or FP4 value misread moves logits by ~1e-2 and more).
"""

from __future__ import annotations

import pytest
import torch
from triton_interp import interpreter_or_skip

INTERPRET = interpreter_or_skip()

from deepring.model.linear import grouped_linear, linear  # noqa: E402
from deepring.model.loader import load_model  # noqa: E402
from quant_helpers import (  # noqa: E402
    quantize_fp8,
    quantize_mxfp4,
    write_quantised_v4,
    write_quantised_v41,
)
from v4_helpers import greedy_generate, model_config, ours, prefill_logits  # noqa: E402
from v41_helpers import make_pool, new_seqs, step, tiny_dict, tiny_model  # noqa: E402

DEV = "cpu" if INTERPRET else "cuda"
RTOL = 1e-4


def _load_both(path):
    kw = {"dtype": "float32", "device": DEV, "progress": False}
    plain = load_model(path, quantised="dequantise", **kw).model
    kept = load_model(path, quantised="keep", **kw).model
    return plain, kept


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = want.abs().max()
    diff = (got - want).abs().max()
    print(f"{what}: max |diff| {diff:.3g}, relative to max |logit| {diff / scale:.3g}")
    torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL * scale, msg=what)


def test_a_kept_v4_model_gives_the_dequantised_models_logits(tmp_path):
    write_quantised_v4(ours(model_config("swa-csa-hca"), seed=5), tmp_path)
    plain, kept = _load_both(tmp_path)
    layer = kept.model.layers[1]
    assert layer.self_attn.q_a_proj.quant == ("fp8", 128)
    assert layer.mlp.experts.quant == ("mxfp4", 32)
    ids = list(range(3, 40, 2))  # 19 tokens: past the sliding window and several compressions
    _close(prefill_logits(kept, ids), prefill_logits(plain, ids), "v4 prefill")
    tokens_kept, logits_kept = greedy_generate(kept, ids[:12], 4)
    tokens_plain, logits_plain = greedy_generate(plain, ids[:12], 4)
    assert tokens_kept == tokens_plain
    _close(logits_kept, logits_plain, "v4 decode")


def test_a_kept_v41_model_gives_the_dequantised_models_logits(tmp_path):
    write_quantised_v41(tiny_model(seed=4), tmp_path, tiny_dict())
    plain, kept = _load_both(tmp_path)
    assert kept.layers[2].attn.wq_a.quant == ("fp8", 32)
    assert any(m.quant == ("mxfp4", 32) for m in kept.modules() if hasattr(m, "quant"))
    out = {}
    for name, model in (("plain", plain), ("kept", kept)):
        model.decoder_keep = 0
        pool, seq = make_pool(model), new_seqs(1)[0]
        prompt = list(range(3, 30, 3))
        logits = [step(model, pool, [seq.chunk(prompt)])]
        tokens = [int(logits[-1][-1].argmax())]
        for _ in range(3):
            logits.append(step(model, pool, [seq.chunk([tokens[-1]])]))
            tokens.append(int(logits[-1][-1].argmax()))
        out[name] = (tokens, torch.cat(logits))
    assert out["kept"][0] == out["plain"][0]
    _close(out["kept"][1], out["plain"][1], "v4.1 prefill + decode")


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("rows", [32, 16])  # a group's rows: whole FP8 blocks, or inside one
def test_the_grouped_output_projection_of_a_kept_layer(fmt, rows):
    groups, inp, block = 2, 64, 32
    w = torch.randn(groups * rows, inp, generator=torch.Generator().manual_seed(rows))
    if fmt == "fp8":
        q, scale, ref = quantize_fp8(w, block)
    else:
        q, scale, ref = quantize_mxfp4(w)
    plain, kept = linear(inp, groups * rows), linear(inp, groups * rows)
    plain.weight.data.copy_(ref)
    kept.keep_quantised(fmt, block)
    kept.weight.copy_(q.view(torch.uint8))
    kept.scale.copy_(scale.view(torch.uint8))
    x = torch.randn(5, groups, inp, generator=torch.Generator().manual_seed(1))
    plain, kept, x = plain.to(DEV), kept.to(DEV), x.to(DEV)
    want = grouped_linear(x, plain)
    torch.testing.assert_close(grouped_linear(x, kept), want, rtol=1e-5, atol=1e-5)
