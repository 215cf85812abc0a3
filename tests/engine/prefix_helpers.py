"""Small engines over the test model for the prefix-cache tests, and a model wrapper that
records every step's logits (the reference is always a cold run of the same engine type)."""

from __future__ import annotations

import dataclasses
import itertools

import torch
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.core.engine import EngineCore
from deepring.core.prefix import PrefixConfig
from deepring.core.runner import ModelRunner
from deepring.core.scheduler import SchedulerConfig
from deepring.sampling.params import SamplingParams

BLOCK = 16  # the test model's ratios are 4 (CSA) and 8 (HCA); its window is 8


class Recording:
    """The model, returning logits on every step and keeping the last row of each request
    that sampled (request order of the step)."""

    def __init__(self, model) -> None:
        self.model = model
        self.logits: list[torch.Tensor] = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, batch, pool, greedy: bool = False):
        out = self.model(batch, pool, greedy=False)
        if out.logits.numel():
            self.logits.extend(out.logits.unbind(0))
        if greedy:  # first maximum, as the greedy head picks
            return dataclasses.replace(out, logits=None, greedy=out.logits.argmax(-1))
        return out


def engine(
    model,
    *,
    replay: str | None = None,
    num_blocks: int = 64,
    budget: int = 2048,
    store=None,
    host_bytes: int = 1 << 30,
    identity: str = "test-model",
    clock=None,
) -> tuple[EngineCore, Recording]:
    rec = Recording(model)
    pool = KVCachePool(
        model.config.cache_layout(model.dtype),
        CacheConfig(num_blocks=num_blocks, num_slots=8, block_size=BLOCK),
        model.device,
    )
    eng = EngineCore(
        ModelRunner(rec, pool),  # type: ignore[arg-type]
        pool.cache,
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget),
        max_model_len=2048,
        vocab_size=model.config.vocab_size,
    )
    if replay is not None:
        eng.enable_prefix_cache(
            PrefixConfig(swa_replay=replay, host_bytes=host_bytes),
            identity=identity,
            num_layers=model.config.num_hidden_layers,
            store=store,
            **({"clock": clock} if clock is not None else {}),
        )
    return eng, rec


def params(n: int = 6, temperature: float = 0.0) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True, seed=5)


_rids = itertools.count(1 << 20)


def run(
    eng: EngineCore, rec: Recording, rid: int | None, ids: list[int], p: SamplingParams,
    images=(),
):  # fmt: skip
    """Serve one request alone (rid None: a fresh one): (its output, its cache hit, its logits
    per sampled token). images: core.images.PromptImage of a V4.1 prompt."""
    rec.logits.clear()
    req = eng.add(next(_rids) if rid is None else rid, ids, p, 5, images=images)
    for _ in range(10_000):
        if not eng.has_work:
            break
        eng.step()
    return req.output_ids, req.cache_hit, torch.stack(rec.logits)


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
