"""Safetensors checkpoints: name mapping, full-coverage validation, dtype policy, saving.

Checkpoints written by transformers (`DeepseekV4ForCausalLM.save_pretrained`, which in 5.x
writes the original tensor names under a `model.` prefix) and checkpoints in transformers'
in-memory naming load as they are. The original DeepSeek layout (`layers.N.attn.wq_a.weight`,
`embed.weight`, per-expert `experts.E.w1/w2/w3`) is renamed the way transformers' conversion
mapping does. Quantised tensors (FP8 block-scaled dense weights, MXFP4 experts, with `.scale`
companions: model.quant) are dequantised to fp32 as they load, then cast like the rest, except
where the model keeps them quantised (model.loader's `quantised`, the default on CUDA):
`keep_quantised` first reads the shards' headers and lays out the backbone's layers for the
checkpoint's formats (model.linear.Linear, model.moe.Experts), and their bytes then load as
they are.
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
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(w[123])\.(weight|scale)$")
# Where a kept expert's scales stack (next to gate_up_proj / down_proj: model.moe.Experts).
_EXPERT_LEAVES = {"weight": ("gate_up_proj", "down_proj"), "scale": ("gate_up_scale", "down_scale")}
# The backbone's layers: the only ones kept quantised. The draft layers (MTP, DSpark) read some
# weights directly (model.dspark), and the embeddings, head and routers are small or have
# their own kernels; all of them load dequantised.
_BACKBONE = re.compile(r"^(?:model\.)?layers\.\d+\.")
# Header dtypes of quantised weights (safetensors' names): FP8 e4m3, packed FP4 bytes.
_HEADER_FORMATS = {"F8_E4M3": "fp8", "F4": "mxfp4", "U8": "mxfp4", "I8": "mxfp4"}
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
    path: Path,
    progress: bool,
    skip: Callable[[str], bool] | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the checkpoint's shards but those `skip` names (never
    read), quantised weights dequantised to fp32 and their scales consumed (model.quant: a
    weight and its scale pair up whatever their order; an unpaired one is an error at the
    end), except those `keep` names (weight keys): their weight and `.scale` come out as
    uint8 bytes, checked."""
    pairs = QuantPairs(_fp8_block(path), keep)
    for key, tensor in _iter_tensors(checkpoint_files(path), progress, skip):
        if is_scale(key, tensor):
            yield from pairs.add_scale(key, tensor)
        elif key.endswith(".weight") and (is_quantised(tensor) or tensor.dtype in _BYTES):
            yield from pairs.add_weight(key, tensor)
        else:
            yield key, tensor
    pairs.finish()


def quantised_weights(path: Path) -> dict[str, str]:
    """Checkpoint key -> "fp8" | "mxfp4" of every weight the shards store quantised with a
    UE8M0 `.scale`, from the safetensors headers alone (no tensor is read). V3-style fp32
    `weight_scale_inv` pairs are left out: they always dequantise (model.quant.QuantPairs)."""
    dtypes: dict[str, str] = {}
    for f in checkpoint_files(path):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                dtypes[key] = fh.get_slice(key).get_dtype()
    out = {}
    for key, dtype in dtypes.items():
        base = key.removesuffix(".weight")
        fmt = _HEADER_FORMATS.get(dtype)
        if key.endswith(".weight") and fmt and dtypes.get(base + ".scale") in ("F8_E8M0", "U8"):
            out[key] = fmt
    return out


def keep_quantised(
    model: nn.Module,
    path: Path,
    rename: Callable[[str], str] = canonical_name,
) -> int:
    """Lay out the backbone's layers whose weights the checkpoint at `path` stores quantised
    (`rename`: checkpoint key -> the model's name) to hold them as they are: a Linear keeps FP8
    or MXFP4, a V4 Experts module MXFP4 (model.linear, model.moe). Call it before the model's
    memory is allocated (on the meta device). Layers whose module cannot keep the format, or
    that read their weight directly (`quantisable` False), still load dequantised. Returns how
    many modules now hold quantised weights."""
    block = _fp8_block(path)
    kept = 0
    for key, fmt in quantised_weights(path).items():
        name = rename(key)
        if not _BACKBONE.match(name):
            continue
        module = _module_of(model, name)
        if module is None:  # an unknown name: load_checkpoint's error to report
            continue
        fits = fmt in getattr(module, "QUANT_FORMATS", ()) and getattr(module, "quantisable", True)
        if fits and module.quant is None:
            module.keep_quantised(fmt, block)
            kept += 1
    return kept


def _module_of(model: nn.Module, name: str) -> nn.Module | None:
    """The module holding weight `name`: its own (V4.1's per-expert Linears too), else the
    V4 Experts module a per-expert checkpoint weight stacks into; None for neither."""
    for path in (name.removesuffix(".weight"), *(m.group(1) for m in [_EXPERT.match(name)] if m)):
        try:
            return model.get_submodule(path)
        except AttributeError:
            continue
    return None


def kept_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The uint8 buffers (weights and scales) of the modules keep_quantised laid out."""
    return {
        f"{mname}.{n}": b
        for mname, m in model.named_modules()
        if getattr(m, "quant", None) is not None
        for n, b in m.named_buffers(recurse=False)
    }


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

    def keep(key: str) -> bool:  # the target was laid out quantised (keep_quantised)
        name = canonical_name(key)
        m = _EXPERT.match(name)
        if m:
            name = f"{m.group(1)}.{'down_proj' if m.group(3) == 'w2' else 'gate_up_proj'}"
        return name in targets and targets[name].dtype == torch.uint8

    seen: set[str] = set()
    stacked: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    unexpected: list[str] = []
    for key, tensor in checkpoint_tensors(path, progress, skip, keep):
        name = canonical_name(key)
        m = _EXPERT.match(name)
        if m:  # per-expert original layout: stacked into gate_up_proj / down_proj below
            leaf = m.group(3) + ("" if m.group(4) == "weight" else ".scale")
            stacked.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[leaf] = tensor
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
        missing = [e for e in ids if not {"w1", "w2", "w3"} <= set(per_expert.get(e, {}))]
        if missing:
            raise ValueError(f"{prefix}: experts {missing[:8]} lack some of w1/w2/w3")
        # Kept experts come with their scales (".scale" entries), stacked the same way.
        for part, (up_leaf, down_leaf) in _EXPERT_LEAVES.items():
            sfx = "" if part == "weight" else ".scale"
            if sfx:
                scaled = [{"w1.scale", "w2.scale", "w3.scale"} <= set(per_expert[e]) for e in ids]
                if not any(scaled):
                    continue
                if not all(scaled):
                    raise ValueError(f"{prefix}: some experts are kept quantised, some are not")
            gate_up = torch.stack(
                [torch.cat([per_expert[e]["w1" + sfx], per_expert[e]["w3" + sfx]], 0) for e in ids]
            )
            down = torch.stack([per_expert[e]["w2" + sfx] for e in ids])
            for leaf, t in ((up_leaf, gate_up), (down_leaf, down)):
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
    if kept_tensors(model):
        # Kept FP8 bytes would be written as plain uint8, which reads back as packed FP4.
        raise ValueError(
            "a model holding quantised weights cannot be saved: load it with quantised='dequantise'"
        )
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
