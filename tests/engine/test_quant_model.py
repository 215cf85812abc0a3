"""A checkpoint in the official quantised layout loaded with its weights kept quantised
(model.loader quantised="keep"): the backbone's dense layers hold FP8 bytes and their block
scales, the routed experts packed MXFP4 and theirs, at the formats' real size, which the memory
plan counts; the rest (embeddings, head, routers, layers the checkpoint stores in BF16) loads as
before; a malformed scale is a clear error in this path too. Logits against the dequantised
model: quant_model_cases.py, run here in a subprocess under TRITON_INTERPRET=1 (the kernels run
in Triton's interpreter on CPU; it must be set before triton is first imported)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from deepring import cli
from deepring.core import memory_plan
from deepring.model.loader import keeps_quantised, load_model
from deepring.model.weights import save_checkpoint
from quant_helpers import write_quantised_v4, write_quantised_v41
from safetensors.torch import save_file
from triton_interp import run_cases
from v4_helpers import model_config, ours
from v41_helpers import tiny_dict, tiny_model

CASES = Path(__file__).with_name("quant_model_cases.py")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("v4-kept")
    tensors, _ = write_quantised_v4(ours(model_config("swa-csa-hca"), seed=5), path)
    return path, tensors


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    """quantised="keep" on CPU asks for Triton's interpreter. This process imported triton
    without it, so nothing here runs a kernel: these tests check layouts, bytes and errors."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _load(path, quantised, **kw):
    return load_model(path, dtype="float32", progress=False, quantised=quantised, **kw).model


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_kept_weights_are_the_checkpoints_bytes_at_their_real_size(checkpoint):
    path, tensors = checkpoint
    kept, plain = _load(path, "keep"), _load(path, "dequantise")
    att = kept.model.layers[0].self_attn
    q_a = "model.layers.0.self_attn.q_a_proj"
    assert att.q_a_proj.quant == ("fp8", 128)
    assert torch.equal(att.q_a_proj.weight, tensors[q_a + ".weight"].view(torch.uint8))
    assert torch.equal(att.q_a_proj.scale, tensors[q_a + ".scale"].view(torch.uint8))
    ex = kept.model.layers[1].mlp.experts
    assert ex.quant == ("mxfp4", 32)
    assert ex.gate_up_proj.dtype == torch.uint8
    w3 = tensors["model.layers.1.mlp.experts.2.w3.weight"]
    assert torch.equal(ex.gate_up_proj[2, w3.shape[0] :], w3)  # w1 rows, then w3's
    # Not kept: what the checkpoint stores in BF16 / fp32, and the head and routers (quantised
    # in the checkpoint, dequantised at load: small, or read by their own kernels).
    assert kept.model.layers[1].self_attn.compressor.kv_proj.quant is None
    assert kept.lm_head.weight.dtype == torch.float32
    assert kept.model.layers[1].mlp.gate.weight.dtype == torch.float32
    assert all(getattr(m, "quant", None) is None for m in plain.modules())
    # FP8: a byte per value plus a scale byte per 128x128 block (a quarter of fp32, the scales
    # round it up); MXFP4: half a byte per value plus a byte per 32 (0.53 / 4 of fp32).
    dense = [m for m in kept.modules() if getattr(m, "quant", None) == ("fp8", 128)]
    assert len(dense) == 4 * 5 + 4 * 3  # per layer: q_a, q_b, kv, o_a, o_b; the shared expert
    fp8_bytes = _nbytes(b for m in dense for b in (m.weight, m.scale))
    fp32_bytes = sum(m.in_features * m.out_features * 4 for m in dense)
    assert fp8_bytes == fp32_bytes // 4 + sum(
        -(-m.out_features // 128) * -(-m.in_features // 128) for m in dense
    )
    experts = [la.mlp.experts for la in kept.model.layers]
    fp4_bytes = _nbytes(t for e in experts for t in e.buffers())
    fp32_experts = _nbytes(t for la in plain.model.layers for t in la.mlp.experts.parameters())
    assert fp4_bytes * 4 * 32 == fp32_experts * (16 + 1)
    total_kept = _nbytes([*kept.parameters(), *kept.buffers()])
    total_plain = _nbytes([*plain.parameters(), *plain.buffers()])
    assert total_plain - total_kept == fp32_bytes - fp8_bytes + fp32_experts - fp4_bytes


def test_a_kept_model_is_not_saved_as_if_plain(checkpoint, tmp_path):
    path, _ = checkpoint
    kept = _load(path, "keep")
    with pytest.raises(ValueError, match="cannot be saved"):
        save_checkpoint(kept, tmp_path, kept.config.to_hf_dict())


def test_the_memory_plan_counts_kept_weights_as_loaded(checkpoint):
    path, _ = checkpoint
    kept = _load(path, "keep")
    experts = _nbytes(t for la in kept.model.layers for t in la.mlp.experts.buffers())
    got = memory_plan.model_bytes(kept.config, torch.float32, kept=path)
    assert got.experts == experts
    assert got.replicated + got.experts == _nbytes([*kept.parameters(), *kept.buffers()])
    plain = memory_plan.model_bytes(kept.config, torch.float32)
    assert plain.experts > 7 * got.experts  # dequantised: 4 bytes a value


def test_the_memory_plan_counts_a_kept_v41_model_as_loaded(tmp_path):
    write_quantised_v41(tiny_model(seed=4), tmp_path, tiny_dict())
    kept = _load(tmp_path, "keep")
    assert kept.layers[2].attn.wq_a.quant == ("fp8", 32)
    assert kept.layers[1].ffn.experts[0].w1.quant == ("mxfp4", 32)
    named = [*kept.named_parameters(), *kept.named_buffers()]
    held = _nbytes(t for n, t in named if ".engram.embed." not in n)  # host memory
    experts = _nbytes(t for n, t in named if re.match(r"layers\.\d+\.ffn\.experts\.", n))
    got = memory_plan.model_bytes(kept.config, torch.float32, kept=tmp_path)
    assert (got.replicated, got.experts) == (held - experts, experts)


def test_the_quantised_mode_follows_the_device_unless_chosen(monkeypatch):
    pytest.importorskip("triton")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert keeps_quantised("auto", cuda)
    assert not keeps_quantised("dequantise", cuda)
    assert keeps_quantised("keep", cpu)  # under the interpreter (tests)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not keeps_quantised("auto", cpu)
    with pytest.raises(ValueError, match="need a CUDA device"):
        keeps_quantised("keep", cpu)
    with pytest.raises(ValueError, match="quantised must be one of"):
        keeps_quantised("fp8", cpu)


def test_generate_threads_the_quantised_mode_to_the_loader(checkpoint, monkeypatch, capsys):
    path, _ = checkpoint
    monkeypatch.delenv("TRITON_INTERPRET")  # keep on a CPU device: refused before any kernel
    argv = ["generate", "--model", str(path), "--ids", "3,5", "--device", "cpu"]
    argv += ["--quantised", "keep"]
    assert cli.main(argv) == 2
    assert "quantised='keep' runs Triton kernels" in capsys.readouterr().err


def test_a_rank_of_an_expert_parallel_group_keeps_its_experts_slots_quantised(checkpoint):
    """A rank loads its 4 of the 8 experts as the whole model would keep them: MXFP4 bytes
    and their scales, 4 slots each; the memory plan's per-expert bytes are what it holds."""
    path, _ = checkpoint
    rank = _load(path, "keep", experts=[0, 2, 5, 7])
    whole = _load(path, "keep")
    layer = rank.model.layers[1]
    assert layer.self_attn.q_a_proj.quant == ("fp8", 128)
    assert layer.mlp.experts.quant == ("mxfp4", 32)
    mine = layer.mlp.experts.slot_tensors()
    full = whole.model.layers[1].mlp.experts.slot_tensors()
    assert sorted(mine) == ["down_proj", "down_scale", "gate_up_proj", "gate_up_scale"]
    rows = torch.tensor([0, 2, 5, 7])
    for name, t in mine.items():
        assert t.dtype == torch.uint8, name
        assert t.shape[0] == 4, name
        assert torch.equal(t, full[name][rows]), name  # the same bytes as the whole model's
    plan = memory_plan.model_bytes(rank.config, torch.float32, kept=path)
    held = _nbytes(t for la in rank.model.layers for t in la.mlp.experts.slot_tensors().values())
    assert plan.experts // plan.n_experts * 4 == held
    assert plan.replicated == _nbytes([*rank.parameters(), *rank.buffers()]) - held


FP8 = "model.layers.0.self_attn.q_a_proj"
FP4 = "model.layers.1.mlp.experts.3.w2"
MALFORMED = {
    "fp8 scale grid": (FP8, lambda s: torch.ones(2, 1).to(torch.float8_e8m0fnu), "scale grid"),
    "mxfp4 scale shape": (FP4, lambda s: s[:, :-1].contiguous(), "one per 32 inputs"),
    "nan scale": (FP8, lambda s: torch.full_like(s.view(torch.uint8), 255), "NaN code"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_scale_is_a_clear_error_when_kept(checkpoint, tmp_path, case):
    path, tensors = checkpoint
    name, edit, match = MALFORMED[case]
    tensors = dict(tensors)
    tensors[name + ".scale"] = edit(tensors[name + ".scale"])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match=match):
        _load(tmp_path, "keep")


def _run_cases(extra_env: dict[str, str]) -> None:
    run_cases(CASES, extra_env)


@pytest.mark.slow  # ~50 s: two tiny models' forwards, every quantised GEMM interpreted
def test_kept_models_give_the_dequantised_logits_in_the_interpreter():
    _run_cases({"TRITON_INTERPRET": "1"})


@pytest.mark.gpu
def test_kept_models_give_the_dequantised_logits_on_gpu():
    _run_cases({})
