"""V4.1 checkpoints in the official tensor naming: loading with full coverage checks, dummy
weights, saving.

The module tree mirrors the checkpoint (`layers.N.attn.compressor.wkv.weight`,
`layers.N.ffn.experts.E.w1.weight`, `layers.N.hc_attn_fn`, `layers.N.engram.embed.weight`,
`mtp.N.markov_head.embed.weight`, ...), so loading is name for name: every tensor the config
implies must be present once with its shape, and every tensor present must be one the config
implies; the error names the tensor. FP8 dense weights (UE8M0 block scales, 32x32 in V4.1
Flash: quantization_config.weight_block_size) and MXFP4 experts are dequantised to fp32 as they
load (model.weights.checkpoint_tensors, model.quant), or kept as they are in the backbone's
layers laid out for them (model.weights.keep_quantised: each expert is its own Linear, so
every kept layer runs model.linear's quantised GEMM). DSpark tensors (`mtp.*`) are optional as
a group, and so are the vision tower's (`vision.*`, `aligner.*`, `image_start` / `image_newline` /
`image_end`): a checkpoint without them is served text only.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from deepring.model.weights import _assign, checkpoint_tensors, kept_tensors, save_checkpoint

# Tensors kept in fp32 whatever the compute dtype (HC mixes, sinks, routing biases, norms).
_FP32_LEAVES = ("attn_sink", "bias", "bias_vl")


def keep_fp32(name: str) -> bool:
    parts = name.split(".")
    if parts[-1].startswith(("hc_attn_", "hc_ffn_")) or parts[-1] in _FP32_LEAVES:
        return True
    # (the vision tower's norms are norm1 / norm2)
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2].rstrip("12").endswith("norm")


def cast_for_inference(model: nn.Module, dtype: torch.dtype) -> None:
    for name, p in model.named_parameters():
        target = torch.float32 if keep_fp32(name) else dtype
        if p.dtype != target:
            p.data = p.data.to(target)


_VISION_PREFIXES = ("vision.", "aligner.", "image_start", "image_newline", "image_end")


def is_vision(name: str) -> bool:
    return name.startswith(_VISION_PREFIXES)


def load_v41_checkpoint(model: nn.Module, path: str | Path, progress: bool = True) -> bool:
    """Fill `model` from the safetensors at `path`; returns whether DSpark tensors were there.
    Without vision tensors the model's tower is dropped (DeepseekV41.drop_vision)."""
    path = Path(path)
    targets = dict(model.named_parameters())
    targets.update(kept_tensors(model))

    def keep(key: str) -> bool:  # the target was laid out quantised (keep_quantised)
        name = key.removeprefix("model.")
        return name in targets and targets[name].dtype == torch.uint8

    seen: set[str] = set()
    unexpected: list[str] = []
    for key, tensor in checkpoint_tensors(path, progress, keep=keep):
        name = key.removeprefix("model.")
        if name not in targets:
            unexpected.append(key)
            continue
        _assign(targets[name], _engram_rows(name, tensor, targets[name]), name, seen)
    mtp = {n for n in targets if n.startswith("mtp.")}
    has_mtp = bool(seen & mtp)
    vision = {n for n in targets if is_vision(n)}
    has_vision = bool(seen & vision)
    optional = (set() if has_mtp else mtp) | (set() if has_vision else vision)
    missing = sorted(set(targets) - seen - optional)
    if missing:
        raise ValueError(f"checkpoint at {path} lacks {len(missing)} tensors, e.g. {missing[:5]}")
    if unexpected:
        raise ValueError(f"checkpoint at {path} has unexpected tensors, e.g. {unexpected[:5]}")
    if not has_vision and hasattr(model, "drop_vision"):
        model.drop_vision()
    return has_mtp


ENGRAM_ROW_ALIGN = 256
MOST_ENGRAM_RANKS = 1024


def _engram_rows(name: str, tensor: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """An Engram table without its padding rows. DeepInfer stores a layer's table row-padded
    to a multiple of lcm(256, its engram-parallel size) (deepinfer-notes.md 1.8; our reading:
    the padding follows the table's own rows). Only a row count that such padding gives is
    cut; any other mismatch stays the shape error that names the tensor."""
    if not name.endswith("engram.embed.weight") or tensor.dim() != 2 or target.dim() != 2:
        return tensor
    rows, got = target.shape[0], tensor.shape[0]
    if got <= rows or tensor.shape[1] != target.shape[1]:
        return tensor
    for ranks in range(1, MOST_ENGRAM_RANKS + 1):
        step = math.lcm(ENGRAM_ROW_ALIGN, ranks)
        if got == -(-rows // step) * step:
            return tensor[:rows]
    return tensor


def init_dummy_v41(model: nn.Module, seed: int = 0) -> None:
    """Seeded random weights that exercise every mechanism: unit-gain projections, non-zero
    sinks, HC bases and routing biases, norm weights near one. The vision tower draws from its
    own generator, after the rest: the language model's weights do not depend on it."""
    params = sorted(model.named_parameters(), key=lambda kv: kv[0])
    text = [(n, p) for n, p in params if not is_vision(n)]
    vision = [(n, p) for n, p in params if is_vision(n)]
    with torch.no_grad():
        for group, gen in ((text, torch.Generator().manual_seed(seed)),
                           (vision, torch.Generator().manual_seed(seed + 1))):  # fmt: skip
            _init_dummy(group, gen)


def _init_dummy(params: list, gen: torch.Generator) -> None:
    def normal(shape: torch.Size, std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    for name, p in params:
        leaf = name.rsplit(".", 1)[-1]
        parent = name.rsplit(".", 2)[-2] if name.count(".") else ""
        if is_vision(name):  # the ViT's norms are norm1 / norm2; small biases
            if parent.rstrip("12").endswith("norm"):
                v = normal(p.shape, 0.1, mean=1.0)
            elif leaf == "bias":
                v = normal(p.shape, 0.02)
            else:
                v = normal(p.shape, 1 / math.sqrt(p.shape[-1]))
        elif name == "embed.weight" or name.endswith("engram.embed.weight"):
            v = normal(p.shape, 1.0)
        elif leaf.endswith("_fn"):
            v = normal(p.shape, 0.02)
        elif leaf.endswith("_base"):
            v = normal(p.shape, 0.5)
        elif leaf.endswith("_scale"):
            v = 0.5 + torch.rand(p.shape, generator=gen)
        elif leaf in ("attn_sink", "bias", "bias_vl"):
            v = normal(p.shape, 0.5)
        elif leaf in ("q_weight", "k_weight"):
            v = normal(p.shape, 0.3, mean=1.0)
        elif parent.endswith("norm"):
            v = normal(p.shape, 0.1, mean=1.0)
        else:  # linear weights [out, in], the router, the Markov tables
            v = normal(p.shape, 1 / math.sqrt(p.shape[-1]))
        p.copy_(v.to(p.dtype))


def save_v41_checkpoint(
    model: nn.Module, path: str | Path, config_dict: dict, dtype: torch.dtype | None = None
) -> None:
    """config.json + model.safetensors in the official naming (fp32-kept tensors in fp32)."""
    if dtype is None:
        save_checkpoint(model, path, config_dict)
        return
    with torch.no_grad():
        saved = {n: p.data for n, p in model.named_parameters()}
        try:
            for n, p in model.named_parameters():
                p.data = p.data.to(torch.float32 if keep_fp32(n) else dtype)
            save_checkpoint(model, path, config_dict)
        finally:
            for n, p in model.named_parameters():
                p.data = saved[n]
