"""The memory plan `deepring serve` prints before it starts anything: for every worker (every
rank of an expert-parallel group), the weights it holds whole (everything but the backbone's
routed experts: attention, the shared experts, the router, norms, embeddings, head, MTP
layers), its share of the routed experts ((E + K) / N slots per layer on a rank of an EP
group of N ranks with K redundant slots; all E on a whole worker), its paged KV pool and
per-request window state, and an estimate of one step's activations; summed per device, and
a clear error when a device cannot hold its workers.

The weight bytes are exact: the model is built on the meta device (no memory) and each tensor
counted at the dtype it is served in (model.weights.keep_fp32); where the worker keeps a
checkpoint's quantised weights (model.loader.keeps_quantised: the default on CUDA), the layers
the checkpoint's headers show quantised are laid out as the loader lays them out
(model.weights.keep_quantised) and counted at their real size: a byte per FP8 value, half a
byte per MXFP4 value, plus the UE8M0 scale bytes. The KV bytes are the pool's
own (cache.pool). The activations are a rough allowance, not a measurement: the live tensors
of the widest step (max_num_batched_tokens rows through the hyper-connection streams,
attention, the indexer and the experts; the sampled rows' fp32 logits).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.config import EngineSpec, WorkerConfig
from deepring.model.config import ModelConfig
from deepring.model.loader import keeps_quantised, resolve_dtype, resolve_model_path
from deepring.model.weights import keep_fp32, keep_quantised

# Hidden-size rows of activations per batched token that one step keeps live at once (the
# hyper-connection streams, attention and indexer projections, the experts' picks): an
# allowance, sized generously over what a V4 layer holds at its peak.
ACTIVATION_ROWS = 48


@dataclass(frozen=True)
class ModelBytes:
    replicated: int  # every worker and rank holds these whole
    experts: int  # the backbone's routed experts, all E of every layer
    n_experts: int


@dataclass(frozen=True)
class WorkerMemory:
    worker: str
    device: str
    replicated: int
    experts: int
    expert_share: str  # e.g. "5/8 per layer"
    kv: int | None  # None: sized at start from the free memory (--kv-cache-fraction)
    activations: int

    @property
    def total(self) -> int:
        return self.replicated + self.experts + (self.kv or 0) + self.activations


# V4.1 parameters by role: a backbone layer's routed experts, and Engram's n-gram tables,
# which stay in host memory (model.v41: gathered per step, never on the accelerator).
_V41_ROUTED = re.compile(r"^layers\.\d+\.ffn\.experts\.")
_V41_HOST = re.compile(r"\.engram\.embed\.")


# A V4 backbone layer's routed experts (their packed bytes and scales when kept quantised).
_V4_ROUTED = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.")


def model_bytes(config: ModelConfig, dtype: torch.dtype, kept: Path | None = None) -> ModelBytes:
    """The weights' bytes served in `dtype` on the device, split into replicated and routed
    experts (V4 or V4.1; V4.1's Engram tables are host memory and not counted). kept: the
    checkpoint whose quantised weights the worker keeps quantised (None: all dequantised; an
    expert-parallel rank keeps its experts' slots like a whole model keeps all of them)."""
    from deepring.model.v41.config import V41Config

    if isinstance(config, V41Config):
        return _v41_bytes(config, dtype, kept)  # (V4.1 does not run expert-parallel)
    from deepring.model.model import DeepseekV4

    with torch.device("meta"):
        net = DeepseekV4(config)
    if kept is not None:
        keep_quantised(net, kept)

    def is_routed(name: str, _p) -> bool:
        return _V4_ROUTED.match(name) is not None

    return _count(net, dtype, keep_fp32, is_routed, config)


def _v41_bytes(config, dtype: torch.dtype, kept: Path | None) -> ModelBytes:
    from deepring.model.v41.model import DeepseekV41
    from deepring.model.v41.weights import keep_fp32 as v41_keep_fp32

    if config.engram is not None and config.engram.compressed_vocab_size:
        # The compressed vocabulary is a token lookup built from the tokenizer, no parameter:
        # the meta model is built without it.
        engram = dataclasses.replace(config.engram, compressed_vocab_size=None)
        config = dataclasses.replace(config, engram=engram)
    with torch.device("meta"):
        net = DeepseekV41(config)
    if kept is not None:
        keep_quantised(net, kept, rename=lambda key: key.removeprefix("model."))

    def routed(name: str, _p) -> bool:
        return _V41_ROUTED.match(name) is not None

    return _count(net, dtype, v41_keep_fp32, routed, config, host=_V41_HOST)


def _count(net, dtype, keep_fp32_of, is_routed, config, host=None) -> ModelBytes:
    """Parameter and buffer bytes of a meta model as served in `dtype` (fp32-kept parameters
    at 4 bytes; buffers, kept quantised weights among them, at their own size), routed
    experts apart; parameters whose name `host` matches are left out."""
    replicated = routed = 0
    for name, p in net.named_parameters():
        if host is not None and host.search(name):
            continue
        n = p.numel() * (4 if keep_fp32_of(name) else dtype.itemsize)
        if is_routed(name, p):
            routed += n
        else:
            replicated += n
    for name, b in net.named_buffers():
        n = b.numel() * b.element_size()
        if is_routed(name, b):
            routed += n
        else:
            replicated += n
    return ModelBytes(replicated, routed, config.n_routed_experts)


def kv_bytes(config: ModelConfig, spec: EngineSpec, dtype: torch.dtype) -> int | None:
    """The paged pool (blocks) plus the per-request window rings and tails (slots)."""
    layout = config.cache_layout(dtype)
    probe = KVCachePool(layout, CacheConfig(num_blocks=1, num_slots=1, block_size=spec.block_size))
    slots = spec.max_num_seqs * probe.bytes_per_slot()
    if spec.kv_cache_fraction is not None:
        return None
    if spec.kv_cache_memory is not None:
        return spec.kv_cache_memory + slots
    return spec.total_blocks * probe.bytes_per_block() + slots


def activation_bytes(config: ModelConfig, spec: EngineSpec, dtype: torch.dtype) -> int:
    rows = spec.max_num_batched_tokens * config.hidden_size * ACTIVATION_ROWS * dtype.itemsize
    return rows + spec.max_num_seqs * config.vocab_size * 4


def device_name(device: str | None) -> str:
    """`--device` as the plan names it: cuda -> cuda:0, None -> what workers pick."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda:0" if device == "cuda" else device


def plan(workers: tuple[WorkerConfig, ...]) -> list[WorkerMemory]:
    """Every worker's memory (the embedded and checkpoint models; zero-cost workers hold
    nothing)."""
    out = []
    cache: dict[tuple, tuple[ModelConfig, ModelBytes]] = {}
    for w in workers:
        spec = w.engine
        dev = device_name(spec.device)
        if spec.zero_cost:
            out.append(WorkerMemory(w.worker_id, dev, 0, 0, "none", 0, 0))
            continue
        dtype = resolve_dtype(spec.dtype, torch.device(dev))
        keep = keeps_quantised(spec.quantised, torch.device(dev)) and spec.load_format != "dummy"
        key = (spec.model, dtype, keep)
        if key not in cache:
            path = resolve_model_path(spec.model)
            config = ModelConfig.from_pretrained(path)
            mb = model_bytes(config, dtype, path if keep else None)
            cache[key] = (config, mb)
        config, mb = cache[key]
        experts, share = mb.experts, f"{mb.n_experts}/{mb.n_experts}"
        if w.ep is not None:
            slots = (mb.n_experts + w.ep.redundant) // w.ep.size
            experts = mb.experts // mb.n_experts * slots
            share = f"{slots}/{mb.n_experts}"
        out.append(
            WorkerMemory(
                w.worker_id,
                dev,
                mb.replicated,
                experts,
                share,
                kv_bytes(config, spec, dtype),
                activation_bytes(config, spec, dtype),
            )
        )
    return out


def device_capacity(device: str) -> int:
    """Bytes a device has: a CUDA device's total memory, or the host's available memory."""
    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        return int(torch.cuda.get_device_properties(index).total_memory)
    from deepring.core.build import free_memory

    return free_memory(torch.device("cpu"))


def check_fits(rows: list[WorkerMemory], limit: int | None = None) -> dict[str, tuple[int, int]]:
    """Per device: (bytes its workers need, bytes it has: `limit` or the device's own).
    ValueError naming the device, what it needs and what it has when it does not fit."""
    out = {}
    for dev in sorted({r.device for r in rows}):
        need = sum(r.total for r in rows if r.device == dev)
        have = limit if limit is not None else device_capacity(dev)
        out[dev] = (need, have)
        if need > have:
            mine = [r for r in rows if r.device == dev]
            biggest = max(mine, key=lambda r: r.total)
            raise ValueError(
                f"the model does not fit: {dev} needs {_mib(need)} for {len(mine)} workers "
                f"({biggest.worker}: weights {_mib(biggest.replicated)} + routed experts "
                f"{_mib(biggest.experts)} + KV {_mib(biggest.kv or 0)} + activations "
                f"~{_mib(biggest.activations)}), and has {_mib(have)}"
                + (" (--max-memory)" if limit is not None else "")
                + "; use more devices (--devices), --ep, or a smaller --kv-cache-memory / "
                "--max-num-seqs"
            )
    return out


def describe(rows: list[WorkerMemory], fits: dict[str, tuple[int, int]]) -> str:
    lines = ["memory plan (weights exact, activations estimated):"]
    for dev, (need, have) in fits.items():
        lines.append(f"  {dev}: {_mib(need)} of {_mib(have)}")
        for r in rows:
            if r.device != dev:
                continue
            kv = "sized at start" if r.kv is None else _mib(r.kv)
            lines.append(
                f"    {r.worker}: weights {_mib(r.replicated)} + routed experts "
                f"{_mib(r.experts)} ({r.expert_share} per layer) + KV {kv} + activations "
                f"~{_mib(r.activations)} = {_mib(r.total)}"
            )
    return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
