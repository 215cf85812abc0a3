"""An EngineCore from an EngineSpec: the model (or the zero-cost runner), its cache pool sized
by the spec, the scheduler. What `LLM` and the serving workers start from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.config import EngineSpec
from deepring.core.engine import EngineCore
from deepring.core.runner import ModelRunner, Runner, cpu_setup
from deepring.core.scheduler import SchedulerConfig
from deepring.core.zero_cost import ZeroCostRunner, text_token_ids
from deepring.model.config import ModelConfig
from deepring.model.model import DeepseekV4


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


def build_engine(spec: EngineSpec, *, progress: bool = False) -> BuiltEngine:
    """Load what `spec` names and size its caches. ValueError for a model that cannot load."""
    from deepring.model.loader import load_model, resolve_model_path

    device = torch.device(spec.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        cpu_setup(spec.cpu_threads)
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
        loaded = load_model(
            spec.model,
            dtype=spec.dtype,
            device=device,
            load_format=spec.load_format,
            seed=spec.seed,
            progress=progress,
        )
        model, path, config = loaded.model, loaded.path, loaded.config
        layout = config.cache_layout(model.dtype)
        runner = ModelRunner(model, KVCachePool(layout, cache, device))
    engine = EngineCore(
        runner,
        cache,
        SchedulerConfig(
            max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens
        ),
        max_model_len=spec.max_model_len,
        vocab_size=config.vocab_size,
        eos_token_ids=config.eos_token_ids,
    )
    random_weights = spec.model == "tiny" or spec.load_format == "dummy"
    return BuiltEngine(engine, config, path, model, random_weights)
