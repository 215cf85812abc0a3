"""An EngineCore from an EngineSpec: the model (or the zero-cost runner), its cache pool sized
by the spec, the scheduler. What `LLM` and the serving workers start from."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.config import EngineSpec, SpecMode
from deepring.core.engine import EngineCore
from deepring.core.prefix import PrefixConfig, Store
from deepring.core.runner import ModelRunner, Runner, cpu_setup
from deepring.core.scheduler import SchedulerConfig
from deepring.core.zero_cost import ZeroCostRunner, text_token_ids
from deepring.cost.presets import prior_for
from deepring.model.config import ModelConfig
from deepring.model.embedded import RANDOM
from deepring.model.model import DeepseekV4

log = logging.getLogger("deepring.cache")
SWEEP_INTERVAL_S = 600.0


@dataclass
class BuiltEngine:
    engine: EngineCore
    config: ModelConfig
    path: Path | None  # the checkpoint directory (None: dummy weights without one)
    model: DeepseekV4 | None  # None in zero-cost mode
    random_weights: bool  # the embedded `tiny` model or dummy weights: output is gibberish

    @property
    def tokenizer_file(self) -> Path | None:
        return _tokenizer_in(self.path)


def _tokenizer_in(path: Path | None) -> Path | None:
    """The checkpoint directory's tokenizer.json, if it has one."""
    tok = path / "tokenizer.json" if path is not None else None
    return tok if tok is not None and tok.is_file() else None


def _device(spec: EngineSpec) -> torch.device:
    """The device `spec` runs on (CPU inference set up once it is chosen)."""
    device = torch.device(spec.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        cpu_setup(spec.cpu_threads)
    return device


def load_weights(
    spec: EngineSpec,
    *,
    progress: bool = False,
    device: torch.device | None = None,
    experts: list[int] | None = None,
):
    """The model `spec` names, loaded (None in zero-cost mode): what a spare worker holds
    before it knows its role (`build_engine(..., loaded=)`). device: already resolved by the
    caller (`_device`); experts: a rank's routed experts, the only ones loaded
    (model.loader.load_model)."""
    from deepring.model.loader import load_model

    if spec.zero_cost:
        return None
    return load_model(
        spec.model,
        dtype=spec.dtype,
        device=device or _device(spec),
        load_format=spec.load_format,
        seed=spec.seed,
        progress=progress,
        experts=experts,
        quantised=spec.quantised,
    )


def build_engine(spec: EngineSpec, *, progress: bool = False, loaded=None) -> BuiltEngine:
    """Load what `spec` names and size its caches. ValueError for a model that cannot load.
    loaded: the model, already loaded (load_weights) with the same model, dtype, device, load
    format, quantised mode and seed."""
    from deepring.model.loader import resolve_model_path

    device = _device(spec)
    mode = SpecMode.parse(spec.speculative)
    if mode.on and spec.zero_cost:
        raise ValueError("--speculative needs a model: it cannot run in zero-cost mode")
    cache = CacheConfig(
        num_blocks=spec.total_blocks, num_slots=spec.max_num_seqs, block_size=spec.block_size
    )
    model = None
    runner: Runner
    if spec.zero_cost:
        path: Path | None = resolve_model_path(spec.model)
        config = ModelConfig.from_pretrained(path)
        runner = ZeroCostRunner(text_token_ids(_tokenizer_in(path)), spec.zero_cost_step_ms / 1000)
    else:
        if loaded is None:
            loaded = load_weights(spec, progress=progress, device=device)
        model, path, config = loaded.model, loaded.path, loaded.config
        if mode.on:
            # The window ring keeps a row for every draft a step may reject (cache.pool).
            most = config.dspark.block_size if mode.kind == "dspark" and config.dspark else 0
            cache = dataclasses.replace(cache, backtrack=max(cache.backtrack, mode.length, most))
        layout = config.cache_layout(model.dtype)
        if spec.kv_cache_fraction is not None:
            free = free_memory(device)
            cache = _sized_by_memory(cache, layout, spec, int(spec.kv_cache_fraction * free))
        elif spec.kv_cache_memory is not None:
            cache = _sized_by_memory(cache, layout, spec, spec.kv_cache_memory)
        runner = ModelRunner(model, KVCachePool(layout, cache, device))
        log.info("KV cache: %s", kv_bytes_line(layout, cache.block_size))
    engine = EngineCore(
        runner,
        cache,
        SchedulerConfig(
            max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens
        ),
        max_model_len=spec.max_model_len,
        vocab_size=config.vocab_size,
        eos_token_ids=config.eos_token_ids,
        cost_prior=prior_for(device.type),
        pacing=spec.pacing(),
    )
    engine.tokenizer_path = _tokenizer_in(path)  # what output constraints compile against
    if mode.on:
        engine.enable_speculation(mode, spec.model)
    if spec.prefix_cache and model is not None:
        store = open_stores(spec)
        prefix = engine.enable_prefix_cache(
            PrefixConfig(
                host_bytes=spec.kv_host_memory,
                ring_ttl_s=spec.swa_ttl_s,
                swa_replay=spec.swa_replay,
                chat_ttl_s=spec.chat_ttl_s,
                agent_ttl_s=spec.agent_ttl_s,
            ),
            identity=model_identity(spec, path, model.dtype),
            num_layers=config.num_hidden_layers,
            store=store,
        )
        if store is not None:  # expired blocks leave the directory store (Redis expires its own)
            from deepring.cache.store import Sweeper

            prefix.sweeper = Sweeper(store, SWEEP_INTERVAL_S).start()
    random_weights = spec.model in RANDOM or spec.load_format == "dummy"
    return BuiltEngine(engine, config, path, model, random_weights)


def kv_bytes_line(layout, block_size: int) -> str:
    """The cache's bytes per token, said at start: the paged (global) KV over every layer, and
    the per-request state (rings, tails)."""
    probe = KVCachePool(layout, CacheConfig(num_blocks=1, num_slots=1, block_size=block_size))
    paged = probe.bytes_per_block() / block_size
    fp4 = any(lay.fp4 for lay in layout.layers)
    kind = "FP4 main KV + indexer keys" if fp4 else str(layout.dtype).replace("torch.", "")
    return (
        f"{paged:g} B/token of global KV ({kind}), {probe.bytes_per_slot()} B of window rings "
        "and tails per request"
    )


def free_memory(device: torch.device) -> int:
    """Bytes free for the KV cache now: the CUDA device's free memory, or the host's available
    memory (MemAvailable) on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _sized_by_memory(cache: CacheConfig, layout, spec: EngineSpec, budget: int) -> CacheConfig:
    """The block count that `budget` bytes hold (plus the reserved block)."""
    probe = KVCachePool(layout, CacheConfig(num_blocks=1, num_slots=1, block_size=cache.block_size))
    n = budget // probe.bytes_per_block()
    if n < spec.blocks_per_seq + 1:
        raise ValueError(
            f"the KV cache budget of {budget} bytes (--kv-cache-memory / --kv-cache-fraction) "
            f"holds {n} blocks of "
            f"{probe.bytes_per_block()} bytes; one request of max_model_len needs "
            f"{spec.blocks_per_seq + 1}"
        )
    return CacheConfig(
        num_blocks=n, num_slots=cache.num_slots, block_size=cache.block_size,
        backtrack=cache.backtrack,
    )  # fmt: skip


def model_identity(spec: EngineSpec, path: Path | None, dtype: torch.dtype) -> str:
    """What the prefix cache's hash chain is rooted in: the weights that computed a block.
    A checkpoint is named by its config and its weight files (names and sizes, not their
    bytes: hashing hundreds of GB at every start is not an option); random weights by their
    seed. Blocks also carry the cache layout's fingerprint (dtype and shapes)."""
    h = hashlib.sha256()
    h.update(
        f"{spec.load_format}/{spec.seed if spec.load_format == 'dummy' else ''}/{dtype}".encode()
    )
    if path is not None and path.is_dir():
        cfg = path / "config.json"
        if cfg.is_file():
            h.update(json.dumps(json.loads(cfg.read_bytes()), sort_keys=True).encode())
        for f in sorted(path.glob("*.safetensors")):
            h.update(f"{f.name}:{f.stat().st_size}".encode())
        h.update(path.name.encode())  # the embedded tiny model's directory names its hash
    else:
        h.update(spec.model.encode())
    return h.hexdigest()


def open_stores(spec: EngineSpec) -> Store | None:
    """The persistent tiers `spec` names: the directory store, then Redis (reads try them in
    that order, writes go to both). None: no persistent tier."""
    urls = [u for u in (spec.kv_cache_dir, spec.kv_store) if u]
    if not urls:
        return None
    from deepring.cache.store import open_store
    from deepring.cache.store.tiered import TieredStore

    stores = [open_store(u) for u in urls]
    log.info("prefix cache: persistent tiers %s", ", ".join(s.url for s in stores))
    return stores[0] if len(stores) == 1 else TieredStore(stores)
