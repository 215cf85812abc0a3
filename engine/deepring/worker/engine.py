"""The engine core a worker drives: requests in, one model step at a time, tokens out."""

from __future__ import annotations

from dataclasses import dataclass

from deepring.cache.allocator import BlockAllocator, SlotAllocator
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.model.model import DeepseekV4
from deepring.sampling.params import SamplingParams
from deepring.worker.request import Request
from deepring.worker.runner import ModelRunner
from deepring.worker.scheduler import Scheduler, SchedulerConfig


@dataclass
class StepResult:
    request: Request
    new_token: int | None  # token sampled this step, if any
    finished: bool


class EngineCore:
    def __init__(
        self,
        model: DeepseekV4,
        cache: CacheConfig,
        scheduler: SchedulerConfig,
        max_model_len: int,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        if scheduler.max_num_seqs > cache.num_slots:
            raise ValueError("max_num_seqs exceeds the number of state slots")
        self.model = model
        self.config = model.config
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pool = KVCachePool(model.config, cache, model.dtype, model.device)
        self.blocks = BlockAllocator(cache.num_blocks)
        self.slots = SlotAllocator(cache.num_slots)
        self.scheduler = Scheduler(scheduler, self.blocks, self.slots, cache.block_size)
        self.runner = ModelRunner(model, self.pool)
        self.requests: dict[str, Request] = {}

    def add_request(
        self, rid: str, prompt_ids: list[int], params: SamplingParams, seed: int
    ) -> Request:
        if rid in self.requests:
            raise ValueError(f"duplicate request id {rid!r}")
        if not prompt_ids:
            raise ValueError("a prompt needs at least one token")
        bad = [t for t in prompt_ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.config.vocab_size}): {bad[:5]}")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len ({self.max_model_len})"
            )
        req = Request(rid=rid, prompt_ids=list(prompt_ids), params=params, seed=seed)
        self.requests[rid] = req
        self.scheduler.add(req)
        return req

    def abort(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is not None and not req.finished:
            self.scheduler.finish(req, "abort")

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def _stop_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if len(req.output_ids) >= p.max_tokens:
            return "length"
        return None

    def step(self) -> list[StepResult]:
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        tokens = self.runner.step(scheduled)
        results = []
        for s, tok in zip(scheduled, tokens, strict=True):
            req = s.request
            done = False
            if tok is not None:
                req.output_ids.append(tok)
                reason = self._stop_reason(req, tok)
                if reason is not None:
                    self.scheduler.finish(req, reason)
                    self.requests.pop(req.rid, None)
                    done = True
            results.append(StepResult(req, tok, done))
        return results
