"""Quantisers of DeepSeek's official checkpoint formats, written from the format description
(not the engine's dequantiser): FP8 e4m3 with power-of-two UE8M0 block scales, MXFP4 (E2M1
pairs per byte, low nibble first, a UE8M0 scale per 32 inputs). Each returns the stored
tensors and the fp32 values they stand for. write_quantised_v4 / write_quantised_v41 write a
tiny model as a checkpoint in the official quantised layout."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

E4M3_MAX = 448.0
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _pow2_exponent(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The smallest power-of-two exponent e with amax / 2^e <= top (0 for all-zero blocks)."""
    e = torch.ceil(torch.log2(amax.clamp(min=1e-30) / top))
    return torch.where(amax > 0, e, torch.zeros_like(e)).clamp(-127, 127)


def quantize_fp8(w: torch.Tensor, block: int = 128):
    """-> (fp8 weight, e8m0 scale grid, dequantised fp32 reference)."""
    out, inp = w.shape
    go, gi = -(-out // block), -(-inp // block)
    padded = torch.zeros(go * block, gi * block)
    padded[:out, :inp] = w
    amax = padded.view(go, block, gi, block).abs().amax(dim=(1, 3))
    e = _pow2_exponent(amax, E4M3_MAX)
    full = torch.exp2(e).repeat_interleave(block, 0)[:out].repeat_interleave(block, 1)[:, :inp]
    q = (w / full).to(torch.float8_e4m3fn)
    scale = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return q, scale, q.float() * full


def quantize_mxfp4(w: torch.Tensor, group: int = 32):
    """-> (packed uint8 [out, in/2], e8m0 scales [out, in/group], dequantised reference)."""
    out, inp = w.shape
    amax = w.view(out, inp // group, group).abs().amax(-1)
    e = _pow2_exponent(amax, 6.0)
    full = torch.exp2(e).repeat_interleave(group, 1)
    v = w / full
    mag = (v.abs().unsqueeze(-1) - E2M1_MAGNITUDES).abs().argmin(-1)
    codes = mag + 8 * (v < 0).long()
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    ref = torch.where(v < 0, -1.0, 1.0) * E2M1_MAGNITUDES[mag] * full
    scale = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return packed, scale, ref


def write_quantised_v4(model, path):
    """Write `model` in the official layout; return the state dict it dequantises to."""
    tensors, reference = {}, {}
    for name, t in model.state_dict().items():
        if name.endswith("inv_freq"):
            continue
        t = t.detach().contiguous()
        t = t.float() if t.is_floating_point() else t
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            reference[name] = torch.empty_like(t)
            prefix = name.rsplit(".", 1)[0]
            for e in range(t.shape[0]):
                if name.endswith("gate_up_proj"):
                    inter = t.shape[1] // 2
                    parts = {"w1": t[e, :inter], "w3": t[e, inter:]}
                else:
                    parts = {"w2": t[e]}
                deq = {}
                for leaf, w in parts.items():
                    packed, scale, deq[leaf] = quantize_mxfp4(w)
                    tensors[f"{prefix}.{e}.{leaf}.weight"] = packed
                    tensors[f"{prefix}.{e}.{leaf}.scale"] = scale
                reference[name][e] = torch.cat([deq["w1"], deq["w3"]]) if "w1" in deq else deq["w2"]
        elif (
            name.endswith(".weight")
            and t.dim() == 2
            and "embed" not in name
            and "compressor" not in name  # BF16 in the official checkpoint
        ):
            q, scale, reference[name] = quantize_fp8(t)
            tensors[name] = q
            tensors[name.removesuffix(".weight") + ".scale"] = scale
        else:
            tensors[name] = reference[name] = t
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    d = model.config.to_hf_dict()
    d["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (path / "config.json").write_text(json.dumps(d), encoding="utf-8")
    return tensors, reference


V41_BLOCK = 32  # V4.1-Flash's weight_block_size
# Tables and small fp32-kept parts stay unquantised (embeddings, Engram's table, routers,
# hyper-connection maps, the Markov and confidence heads).
_PLAIN = ("embed", "gate.weight", "markov_head", "confidence_head", "weights_proj", "head.weight")


def write_quantised_v41(model, path, config: dict):
    """Write V4.1 `model` (its HF-style config dict `config`) as V4.1-Flash is quantised;
    return the stored tensors and the state dict they dequantise to."""
    tensors, reference = {}, {}
    for name, t in model.state_dict().items():
        t = t.detach().float().contiguous()
        base = name.removesuffix(".weight")
        if not name.endswith(".weight") or t.dim() != 2 or any(p in name for p in _PLAIN):
            tensors[name] = reference[name] = t
        elif ".experts." in name and ".shared_experts." not in name:
            packed, scale, reference[name] = quantize_mxfp4(t)
            tensors[name], tensors[base + ".scale"] = packed, scale
        else:
            q, scale, reference[name] = quantize_fp8(t, V41_BLOCK)
            tensors[name], tensors[base + ".scale"] = q, scale
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    assert config["quantization_config"]["weight_block_size"] == [V41_BLOCK, V41_BLOCK]
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return tensors, reference
