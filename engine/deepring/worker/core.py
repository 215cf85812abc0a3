"""The engine inside a serving worker: EngineCore's step loop plus what the rings need.

Compared with the offline EngineCore it can
- take in a request that another worker prefilled (`admit`: cache state written into a fresh
  slot and fresh blocks, the request joins the running batch without recomputing anything),
- give a request away (`export` its cache state, then `finish` it here, freeing its blocks),
- run without a model (zero-cost mode: scheduling and block accounting only),
- report its load.
The scheduler (chunked prefill, continuous batching, preemption with recompute) is shared with
the offline engine.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from deepring.cache.allocator import BlockAllocator, SlotAllocator
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.config import EngineSpec
from deepring.sampling.params import SamplingParams
from deepring.worker.engine import StepResult
from deepring.worker.handoff import CacheState, export_state, import_state
from deepring.worker.request import Request, Status
from deepring.worker.runner import ModelRunner, cpu_setup
from deepring.worker.scheduler import Scheduler, SchedulerConfig
from deepring.worker.zero_cost import ZeroCostRunner, text_token_ids


class WorkerEngine:
    def __init__(self, spec: EngineSpec) -> None:
        from deepring.model.config import ModelConfig
        from deepring.model.loader import load_model, resolve_model_path

        self.spec = spec
        device = torch.device(spec.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cpu":
            cpu_setup(spec.cpu_threads)
        self.pool: KVCachePool | None = None
        if spec.zero_cost:
            self.path: Path | None = resolve_model_path(spec.model)
            self.config = ModelConfig.from_pretrained(self.path)
            tok = self.path / "tokenizer.json"
            self.runner: ModelRunner | ZeroCostRunner = ZeroCostRunner(
                text_token_ids(tok if tok.is_file() else None), spec.zero_cost_step_ms / 1000
            )
        else:
            loaded = load_model(
                spec.model,
                dtype=spec.dtype,
                device=device,
                load_format=spec.load_format,
                seed=spec.seed,
                progress=False,
            )
            self.path, self.config = loaded.path, loaded.config
            cache = CacheConfig(
                num_blocks=spec.total_blocks,
                num_slots=spec.max_num_seqs,
                block_size=spec.block_size,
            )
            self.pool = KVCachePool(loaded.model.config, cache, loaded.model.dtype, device)
            self.runner = ModelRunner(loaded.model, self.pool)
        self.block_size = spec.block_size
        self.blocks = BlockAllocator(spec.total_blocks)
        self.slots = SlotAllocator(spec.max_num_seqs)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens
            ),
            self.blocks,
            self.slots,
            spec.block_size,
        )
        self.eos_token_ids = frozenset(self.config.eos_token_ids)
        self.requests: dict[int, Request] = {}
        self.num_steps = 0
        self.num_generated = 0
        self.step_seconds = 0.0  # total wall time inside step()

    # ---- facts for the frontend -----------------------------------------------------------------

    @property
    def tokenizer_file(self) -> Path | None:
        if self.path is None:
            return None
        tok = self.path / "tokenizer.json"
        return tok if tok.is_file() else None

    def info(self) -> dict:
        return {
            "model": self.spec.model,
            "zero_cost": self.spec.zero_cost,
            "max_model_len": self.spec.max_model_len,
            "vocab_size": self.config.vocab_size,
            "eos_token_ids": sorted(self.eos_token_ids),
            "num_slots": self.spec.max_num_seqs,
            "num_blocks": self.spec.total_blocks,
            "block_size": self.block_size,
            "tokenizer": str(self.tokenizer_file) if self.tokenizer_file else None,
        }

    # ---- requests ------------------------------------------------------------------------------

    def _check(self, rid: int, token_ids: list[int], params: SamplingParams) -> None:
        if rid in self.requests:
            raise ValueError(f"duplicate request id {rid!r}")
        if not token_ids:
            raise ValueError("a prompt needs at least one token")
        vocab = self.config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids out of range [0, {vocab}): {bad[:5]}")

    def add(self, rid: int, prompt_ids: list[int], params: SamplingParams, seed: int) -> Request:
        """A new request, prefilled from scratch. ValueError when it cannot be served."""
        self._check(rid, prompt_ids, params)
        if len(prompt_ids) + params.max_tokens > self.spec.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len ({self.spec.max_model_len})"
            )
        req = Request(rid=rid, prompt_ids=list(prompt_ids), params=params, seed=seed)  # type: ignore[arg-type]
        self.requests[rid] = req
        self.scheduler.add(req)
        return req

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_admit(self, num_cached: int) -> bool:
        """Room for a prefilled request: a slot, a batch place, and blocks for its cached tokens
        plus the next one, without eating into what the running requests will need next."""
        s = self.scheduler
        if self.slots.num_free == 0 or len(s.running) >= s.config.max_num_seqs:
            return False
        # Reserve one block per running request: each may cross a block boundary next step.
        reserve = len(s.running)
        return self.blocks.num_free >= self.blocks_for(num_cached + 1) + reserve

    def admit(
        self,
        rid: int,
        token_ids: list[int],
        prompt_len: int,
        num_cached: int,
        params: SamplingParams,
        seed: int,
        state: CacheState,
    ) -> Request:
        """Join a request prefilled elsewhere to the running batch. ValueError when its state
        does not fit this worker (check `can_admit` first for room)."""
        self._check(rid, token_ids, params)
        if not 0 < prompt_len <= len(token_ids) or not 0 < num_cached <= len(token_ids):
            raise ValueError("handoff token counts are inconsistent")
        if len(token_ids) - prompt_len > params.max_tokens or (
            prompt_len + params.max_tokens > self.spec.max_model_len
        ):
            raise ValueError("handoff exceeds max_tokens or max_model_len")
        if self.blocks_for(num_cached) != state.num_blocks:
            raise ValueError(f"{num_cached} cached tokens cannot fill {state.num_blocks} blocks")
        slot = self.slots.allocate()
        blocks = self.blocks.allocate(state.num_blocks)
        try:
            import_state(self.pool, state, slot, blocks)
        except ValueError:
            self.slots.free(slot)
            self.blocks.free(blocks)
            raise
        req = Request(
            rid=rid,  # type: ignore[arg-type]
            prompt_ids=list(token_ids[:prompt_len]),
            params=params,
            seed=seed,
            output_ids=list(token_ids[prompt_len:]),
            num_cached=num_cached,
            slot=slot,
            blocks=blocks,
            status=Status.RUNNING,
        )
        self.requests[rid] = req
        self.scheduler.running.append(req)
        return req

    def export(self, req: Request) -> CacheState:
        if req.slot is None:
            raise ValueError(f"request {req.rid} holds no cache state")
        return export_state(self.pool, req.slot, req.blocks)

    def finish(self, req: Request, reason: str) -> None:
        """End `req` here (its slot and blocks are freed at once)."""
        if not req.finished:
            self.scheduler.finish(req, reason)
        self.requests.pop(req.rid, None)  # type: ignore[call-overload]

    def abort(self, rid: int) -> bool:
        req = self.requests.get(rid)
        if req is None:
            return False
        self.finish(req, "abort")
        return True

    def abort_all(self) -> list[int]:
        rids = list(self.requests)
        for rid in rids:
            self.abort(rid)
        return rids

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ---- stepping ------------------------------------------------------------------------------

    def _stop_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if len(req.output_ids) >= p.max_tokens:
            return "length"
        return None

    def step(self) -> list[StepResult]:
        """One scheduled step. Finished requests are freed before this returns."""
        t0 = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        self.num_steps += 1
        tokens = self.runner.step(scheduled)
        results = []
        for s, tok in zip(scheduled, tokens, strict=True):
            req = s.request
            done = False
            if tok is not None:
                self.num_generated += 1
                req.output_ids.append(tok)
                reason = self._stop_reason(req, tok)
                if reason is not None:
                    self.finish(req, reason)
                    done = True
            results.append(StepResult(req, tok, done))
        self.step_seconds += time.perf_counter() - t0
        return results

    def load(self) -> dict:
        s = self.scheduler
        return {
            "waiting": len(s.waiting),
            "running": len(s.running),
            "free_slots": self.slots.num_free,
            "num_slots": self.slots.num_slots,
            "used_blocks": self.blocks.num_used,
            "num_blocks": self.blocks.num_blocks - self.blocks.reserved,
            "queued_tokens": sum(r.pending for r in (*s.waiting, *s.running) if r.pending > 1),
            "steps": self.num_steps,
            "step_seconds": self.step_seconds,
            "generated": self.num_generated,
            "preemptions": s.num_preemptions,
        }
