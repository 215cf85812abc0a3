"""Safetensors checkpoints: name mapping, full-coverage validation, dtype policy, saving.

Checkpoints written by transformers (`DeepseekV4ForCausalLM.save_pretrained`, which in 5.x
writes the original tensor names under a `model.` prefix) and checkpoints in transformers'
in-memory naming load as they are. The original DeepSeek layout (`layers.N.attn.wq_a.weight`,
`embed.weight`, per-expert `experts.E.w1/w2/w3`) is renamed the way transformers' conversion
mapping does. Quantised tensors (FP8 block-scaled dense weights, MXFP4 experts, with `.scale`
companions: model.quant) are dequantised to fp32 as they load, then cast like the rest.
Shards are memory-mapped (safetensors' safe_open) and read one tensor at a time. Every
parameter and persistent buffer must be present exactly once with the right shape; a missing or
misshapen tensor is an error naming it. MTP tensors (`mtp.N.*`) are optional as a group:
transformers' save_pretrained drops them, so a checkpoint without any loads with MTP disabled,
but a partial set is an error.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from deepring.model.quant import FP8_BLOCK, QuantPairs, is_quantised, is_scale

# Module paths whose tensors stay fp32 whatever the compute dtype (as transformers keeps them).
_FP32_PARTS = ("attn_hc", "ffn_hc", "hc_head")
_FP32_LEAVES = ("sinks", "position_bias", "e_score_correction_bias")

_RENAMES = [
    (r"\.attn\.", ".self_attn."),
    (r"\.ffn\.", ".mlp."),
    (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight", "model.embed_tokens.weight"),
    (r"^head\.weight", "lm_head.weight"),
    (r"^norm\.weight", "model.norm.weight"),
    (r"^hc_head_fn", "model.hc_head.hc_fn"),
    (r"^hc_head_base", "model.hc_head.hc_base"),
    (r"^hc_head_scale", "model.hc_head.hc_scale"),
    (r"\.hc_head_fn", ".hc_head.hc_fn"),
    (r"\.hc_head_base", ".hc_head.hc_base"),
    (r"\.hc_head_scale", ".hc_head.hc_scale"),
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_attn_fn", ".attn_hc.fn"),
    (r"\.hc_attn_base", ".attn_hc.base"),
    (r"\.hc_attn_scale", ".attn_hc.scale"),
    (r"\.hc_ffn_fn", ".ffn_hc.fn"),
    (r"\.hc_ffn_base", ".ffn_hc.base"),
    (r"\.hc_ffn_scale", ".ffn_hc.scale"),
    (r"\.attn_sink", ".sinks"),
    (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."),
    (r"(self_attn|compressor|indexer)\.norm\.", r"\1.kv_norm."),
    (r"\.ape$", ".position_bias"),
    (r"\.wq_a\.", ".q_a_proj."),
    (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."),
    (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
]
# Byte-typed weights are packed FP4 (no parameter is stored as bytes); they wait for a scale.
_BYTES = (torch.uint8, torch.int8)
_ORIGINAL_LAYER = re.compile(r"^layers\.\d+\.")
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(w[123])\.weight$")
# A backbone layer's routed expert under its checkpoint name (original layout, either naming;
# its FP8 / MXFP4 scales too): what a rank of an expert-parallel group may leave unread.
_BACKBONE_EXPERT = re.compile(r"^(?:model\.)?layers\.\d+\.(?:ffn|mlp)\.experts\.(\d+)\.")
# A backbone layer's experts fused into one tensor each (transformers layout).
_FUSED_EXPERTS = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(?:gate_up_proj|down_proj)$")


def keep_fp32(name: str) -> bool:
    parts = name.split(".")
    if any(p in _FP32_PARTS for p in parts) or parts[-1] in _FP32_LEAVES:
        return True
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2].endswith("norm")


def cast_for_inference(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating tensors to `dtype`, except those transformers keeps in fp32."""
    for name, p in model.named_parameters():
        target = torch.float32 if keep_fp32(name) else dtype
        if p.dtype != target:
            p.data = p.data.to(target)


def canonical_name(name: str) -> str:
    """Map a checkpoint tensor name onto this engine's (= transformers') names."""
    if _ORIGINAL_LAYER.match(name):
        name = "model." + name
    # The renames leave transformers-native names alone, so they apply to every layout
    # (transformers 5 itself saves a mix: `model.layers.N.attn.wq_a.weight`, `head.weight`).
    for pat, rep in _RENAMES:
        name = re.sub(pat, rep, name)
    return name


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        files = sorted({path / f for f in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"checkpoint shards listed in {index} are missing: {missing}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {path}")
    return files


def _iter_tensors(
    files: list[Path], progress: bool, skip: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint but those `skip` names (never read from the file)."""
    total = 0
    t0 = time.monotonic()
    for i, f in enumerate(files):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if skip is not None and skip(key):
                    continue
                t = fh.get_tensor(key)
                total += t.numel() * t.element_size()
                yield key, t
        if progress:
            print(
                f"\rloading weights: {i + 1}/{len(files)} files, {total / 2**20:.0f} MiB, "
                f"{time.monotonic() - t0:.1f}s",
                end="" if i + 1 < len(files) else "\n",
                file=sys.stderr,
                flush=True,
            )


def _fp8_block(path: Path) -> int:
    """The FP8 block edge of the checkpoint's quantization_config (128 for V4)."""
    if not (path / "config.json").is_file():
        return FP8_BLOCK
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    q = config.get("quantization_config") or config.get("text_config", {}).get(
        "quantization_config"
    )
    size = (q or {}).get("weight_block_size", [FP8_BLOCK, FP8_BLOCK])
    if len(size) != 2 or size[0] != size[1] or int(size[0]) < 1:
        raise ValueError(f"quantization_config.weight_block_size must be [b, b], got {size}")
    return int(size[0])


def checkpoint_tensors(
    path: Path, progress: bool, skip: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the checkpoint's shards but those `skip` names (never
    read), quantised weights dequantised to fp32 and their scales consumed (model.quant: a
    weight and its scale pair up whatever their order; an unpaired one is an error at the
    end)."""
    pairs = QuantPairs(_fp8_block(path))
    for key, tensor in _iter_tensors(checkpoint_files(path), progress, skip):
        if is_scale(key, tensor):
            done = pairs.add_scale(key, tensor)
            if done is None:
                continue
            key, tensor = done
        elif key.endswith(".weight") and (is_quantised(tensor) or tensor.dtype in _BYTES):
            dequantised = pairs.add_weight(key, tensor)
            if dequantised is None:
                continue
            tensor = dequantised
        yield key, tensor
    pairs.finish()


def load_checkpoint(
    model: nn.Module,
    path: str | Path,
    progress: bool = True,
    experts: Sequence[int] | None = None,
) -> bool:
    """Fill `model` from the safetensors checkpoint at `path`.

    experts: a rank of an expert-parallel group: the routed experts its slots hold, in slot
    order, in every backbone MoE layer (the model's expert tensors have that many rows). The
    other experts are never read in the original per-expert layout (what DeepSeek ships); a
    transformers checkpoint fuses a layer's experts into one tensor, which is read and cut.
    MTP layers keep all their experts.

    Returns whether MTP weights were present (the caller drops the MTP layers otherwise).
    """
    path = Path(path)
    mine = None if experts is None else torch.tensor(list(experts), dtype=torch.long)
    wanted = set() if experts is None else set(experts)

    def skip(key: str) -> bool:
        m = _BACKBONE_EXPERT.match(key) if experts is not None else None
        return m is not None and int(m.group(1)) not in wanted

    targets = dict(model.named_parameters())
    targets.update({n: b for n, b in model.named_buffers() if not n.endswith("inv_freq")})
    seen: set[str] = set()
    stacked: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    unexpected: list[str] = []
    for key, tensor in checkpoint_tensors(path, progress, skip):
        name = canonical_name(key)
        m = _EXPERT.match(name)
        if m:  # per-expert original layout: stacked into gate_up_proj / down_proj below
            stacked.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = tensor
            continue
        if name not in targets:
            unexpected.append(key)
            continue
        if mine is not None and _FUSED_EXPERTS.match(name):
            tensor = tensor.index_select(0, mine)
        _assign(targets[name], tensor, name, seen)
    for prefix, per_expert in stacked.items():
        ids = list(range(len(per_expert)))
        if experts is not None and prefix.startswith("model.layers."):
            ids = list(experts)
        missing = [e for e in ids if set(per_expert.get(e, {})) != {"w1", "w2", "w3"}]
        if missing:
            raise ValueError(f"{prefix}: experts {missing[:8]} lack some of w1/w2/w3")
        gate_up = torch.stack(
            [torch.cat([per_expert[e]["w1"], per_expert[e]["w3"]], 0) for e in ids]
        )
        down = torch.stack([per_expert[e]["w2"] for e in ids])
        for leaf, t in (("gate_up_proj", gate_up), ("down_proj", down)):
            name = f"{prefix}.{leaf}"
            if name not in targets:
                unexpected.append(name)
                continue
            _assign(targets[name], t, name, seen)
    mtp_names = {n for n in targets if n.startswith("mtp.")}
    has_mtp = bool(seen & mtp_names)
    missing = sorted(set(targets) - seen - (set() if has_mtp else mtp_names))
    if missing:
        raise ValueError(f"checkpoint at {path} lacks {len(missing)} tensors, e.g. {missing[:5]}")
    foreign = [k for k in unexpected if not canonical_name(k).startswith("mtp.")]
    if foreign:
        raise ValueError(f"checkpoint at {path} has unexpected tensors, e.g. {foreign[:5]}")
    return has_mtp


def _assign(target: torch.Tensor, tensor: torch.Tensor, name: str, seen: set[str]) -> None:
    if name in seen:
        raise ValueError(f"tensor {name!r} appears twice in the checkpoint")
    if tuple(tensor.shape) != tuple(target.shape):
        raise ValueError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, the config implies "
            f"{tuple(target.shape)}"
        )
    if target.is_floating_point() != tensor.is_floating_point():
        raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}, expected like {target.dtype}")
    with torch.no_grad():
        target.copy_(tensor.to(target.dtype))
    seen.add(name)


def save_checkpoint(
    model: nn.Module, path: str | Path, config_dict: dict, dtype: torch.dtype | None = None
) -> None:
    """Write config.json + model.safetensors (tensors in `dtype`, fp32-kept ones in fp32)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("inv_freq"):
            continue
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(torch.float32 if keep_fp32(name) else dtype)
        tensors[name] = t.contiguous().cpu()
    tmp = path / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(config_dict, indent=2), encoding="utf-8")
