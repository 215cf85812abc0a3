"""Build a DeepseekV4 from a checkpoint directory, an embedded model (model.embedded), or dummy
weights."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from deepring.kernels.cpu_warmup import warm_up_cpu_kernels
from deepring.kernels.dispatch import triton_runs_on
from deepring.model.config import ModelConfig
from deepring.model.dspark import read_draft_vocab
from deepring.model.dummy import init_dummy_weights
from deepring.model.embedded import EMBEDDED, embedded_dir
from deepring.model.model import DeepseekV4
from deepring.model.weights import cast_for_inference, keep_quantised, load_checkpoint

LOAD_FORMATS = ("auto", "dummy")
QUANTISED = ("auto", "keep", "dequantise")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: DeepseekV4
    config: ModelConfig
    path: Path | None  # checkpoint directory (None for dummy weights without a directory)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """Default: fp32 on CPU (bf16 matmuls are not reliably faster there), bf16 on GPUs."""
    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or 'auto', got {dtype!r}")
    return _DTYPES[dtype]


def keeps_quantised(quantised: str, device: torch.device) -> bool:
    """Whether a checkpoint's quantised weights stay quantised in memory (model.linear, the
    kernels.quant_gemm GEMMs) or dequantise at load. auto: kept where the Triton kernels run
    (CUDA), where FP8 / FP4 is what lets the experts fit; dequantised on CPU, where plain GEMMs
    are faster. keep: kept, which on a CPU device needs Triton's interpreter (tests only).
    A rank of an expert-parallel group keeps its routed experts' slots as well (their scales
    move with them: model.moe.Experts.slot_tensors)."""
    if quantised not in QUANTISED:
        raise ValueError(f"quantised must be one of {QUANTISED}, got {quantised!r}")
    runs = triton_runs_on(device)
    if quantised == "keep" and not runs:
        raise ValueError(
            f"quantised='keep' runs Triton kernels, which need a CUDA device (or "
            f"TRITON_INTERPRET=1), not {device.type}: use quantised='dequantise'"
        )
    return quantised == "keep" or (quantised == "auto" and runs)


def resolve_model_path(model: str | Path) -> Path:
    if str(model) in EMBEDDED:
        return embedded_dir(str(model))
    p = Path(model).expanduser()
    if not (p / "config.json").is_file():
        raise ValueError(
            f"model {str(model)!r} is neither an embedded model ({', '.join(EMBEDDED)}) nor a "
            "directory with config.json"
        )
    return p


def load_model(
    model: str | Path | ModelConfig = "tiny",
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    load_format: str = "auto",
    seed: int = 0,
    progress: bool = True,
    experts: Sequence[int] | None = None,
    quantised: str = "auto",
) -> LoadedModel:
    """experts: a rank of an expert-parallel group (ep.group): the routed experts of its slots,
    in slot order, the same in every backbone MoE layer; only they are allocated and read
    (model.weights.load_checkpoint), so a rank holds 1/N of the experts from the start. The
    model then runs only under ExpertParallel(..., sharded=True).
    quantised: auto | keep | dequantise, what happens to a checkpoint's FP8 / MXFP4 weights
    (keeps_quantised)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    device = torch.device(device)
    keep = keeps_quantised(quantised, device) and load_format != "dummy"
    path = None
    if isinstance(model, ModelConfig) or getattr(model, "model_type", None) == "deepseek_v41":
        if load_format != "dummy":
            raise ValueError("a bare ModelConfig has no weights: use load_format='dummy'")
        config = model
    else:
        path = resolve_model_path(model)
        config = ModelConfig.from_pretrained(path)
    if getattr(config, "model_type", None) == "deepseek_v41":
        return _load_v41(config, path, load_format, seed, dtype, device, progress, keep)
    if experts is not None and getattr(config, "model_type", None) != "deepseek_v4":
        raise ValueError("only DeepSeek V4 MoE models load a rank's experts")
    with torch.device("meta"):
        net = DeepseekV4(config)
    if experts is not None and load_format != "dummy":
        _expert_rows(net, list(experts))
    if keep:
        keep_quantised(net, path)
    net.to_empty(device="cpu")
    if load_format == "dummy":
        init_dummy_weights(net, seed)
        if experts is not None:
            # Dummy weights are drawn for the whole model (the same as a single process's),
            # then cut to the rank's experts.
            _expert_rows(net, list(experts))
    else:
        has_mtp = load_checkpoint(net, path, progress=progress, experts=experts)
        if not has_mtp and config.num_nextn_predict_layers:
            # No MTP / DSpark tensors: run without the draft layers (and their cache).
            config = dataclasses.replace(
                config, num_nextn_predict_layers=0, mtp_layer_types=(), dspark=None
            )
            net.config = config
            net.mtp = nn.ModuleList()
    cast_for_inference(net, resolve_dtype(dtype, device))
    net.to(device)
    net.eval()
    net.requires_grad_(False)
    net.prepare_greedy_head()
    if config.dspark is not None:
        net.draft_vocab = read_draft_vocab(path, config.vocab_size)
    if device.type == "cpu" and net.dtype == torch.float32:
        warm_up_cpu_kernels()
    return LoadedModel(model=net, config=config, path=path)


def _expert_rows(net: DeepseekV4, experts: list[int]) -> None:
    """Every backbone MoE layer's routed experts cut to `experts` (on the meta device: only
    the shapes change, and nothing is allocated until to_empty)."""
    for layer in net.model.layers:
        layer.mlp.experts.keep_slots(experts)  # (kept MXFP4 experts: their scales too)


def _load_v41(config, path, load_format, seed, dtype, device, progress, keep) -> LoadedModel:
    """load_model for a DeepSeek V4.1 config (model.v41)."""
    from deepring.model.v41.model import DeepseekV41
    from deepring.model.v41.weights import cast_for_inference as cast41
    from deepring.model.v41.weights import init_dummy_v41, load_v41_checkpoint

    net = DeepseekV41(config, tokenizer=path / "tokenizer.json" if path is not None else None)
    if keep:  # (the V4.1 model is built in memory: its kept layers' fp32 weights are freed)
        keep_quantised(net, path, rename=lambda key: key.removeprefix("model."))
    if load_format == "dummy":
        init_dummy_v41(net, seed)
    elif not load_v41_checkpoint(net, path, progress=progress) and len(net.mtp):
        net.mtp = nn.ModuleList()  # no DSpark tensors: run without the drafter
        config = dataclasses.replace(config, dspark=None, num_nextn_predict_layers=0)
        net.config = config
    cast41(net, resolve_dtype(dtype, device))
    net.to(device)
    net.eval()
    net.requires_grad_(False)
    net.prepare_greedy_head()
    return LoadedModel(model=net, config=config, path=path)
