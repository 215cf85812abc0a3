"""The engine core: requests in, one scheduled model step at a time, tokens out.

`LLM` (offline) and every serving worker drive this one class; the runner is injected (the
model runner, or the zero-cost runner that measures the serving stack alone). Beyond the step
loop it can
- take in a request that another worker prefilled (`admit`: cache state written into a fresh
  slot and fresh blocks, the request joins the running batch without recomputing anything),
- give a request away (`export` its cache state, then `finish` it here, freeing its blocks),
- report its load.
Request ids are integers, chosen by the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from deepring.cache.allocator import BlockAllocator, SlotAllocator
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.cache.transfer import CacheState, export_state, import_state
from deepring.config import CACHE_CLASSES
from deepring.core.images import PromptImage, attach_images, check_images
from deepring.core.prefix import PrefixCache, PrefixConfig, Store
from deepring.core.request import Request, Status
from deepring.core.runner import Runner
from deepring.core.scheduler import Scheduler, SchedulerConfig
from deepring.cost.model import WARMUP_STEPS, OnlineFit, StepCost, StepShape
from deepring.cost.pacer import Pacer, PacerConfig
from deepring.cost.presets import TINY_CPU
from deepring.sampling.params import SamplingParams, TokenLogprob
from deepring.structured.constraint import Constraint
from deepring.token_ids import ids_in_range

log = logging.getLogger("deepring.engine")


@dataclass
class StepResult:
    """One token a request emitted in a step (speculative steps emit several, in order), or
    its mid-prompt chunk (new_token None)."""

    request: Request
    new_token: int | None  # token sampled this step, if any
    finished: bool
    logprobs: TokenLogprob | None = None  # the new token's, when its params ask for them
    index: int = -1  # the token's place in the request's output (-1: no token)


class EngineCore:
    def __init__(
        self,
        runner: Runner,
        cache: CacheConfig,
        scheduler: SchedulerConfig,
        *,
        max_model_len: int,
        vocab_size: int,
        eos_token_ids: tuple[int, ...] = (),
        cost_prior: StepCost = TINY_CPU,
        pacing: PacerConfig | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """cost_prior: the step-time model the online fit starts from (cost.presets); pacing: a
        latency target for chunk sizes (cost.pacer); clock: what steps are timed with (the
        simulator passes its simulated time)."""
        if scheduler.max_num_seqs > cache.num_slots:
            raise ValueError("max_num_seqs exceeds the number of state slots")
        if max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        self.runner = runner
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_size = cache.block_size
        self.blocks = BlockAllocator(cache.num_blocks)
        self.slots = SlotAllocator(cache.num_slots)
        self.scheduler = Scheduler(scheduler, self.blocks, self.slots, cache.block_size)
        self.requests: dict[int, Request] = {}
        self.num_steps = 0
        self.num_generated = 0
        self.step_seconds = 0.0  # total wall time inside step()
        # Of that, inside the runner (the model and the sampler: the device's share of a
        # step; the rest is scheduling and bookkeeping on the CPU), and the last step's phases
        # (start, runner start, runner end, end) on `clock` (worker.timeline).
        self.compute_seconds = 0.0
        self.last_phases: tuple[float, float, float, float] | None = None
        self.prefix: PrefixCache | None = None
        # Structured output: the tokenizer.json constrained requests compile against (set by
        # build_engine), and the compiler, made on the first constrained request or before
        # (prepare_grammars).
        self.tokenizer_path: Path | None = None
        self._grammars = None
        # Every step is timed and fitted (cost.model): the pacer predicts with it, and the load
        # report carries it to the routers.
        self.clock = clock
        self.cost = OnlineFit(cost_prior, warmup=WARMUP_STEPS)
        self.last_step: tuple[StepShape, float] | None = None
        if pacing is not None:
            self.scheduler.pacer = Pacer(pacing, lambda: self.cost.model, clock)
        self.spec = None  # core.speculative.SpecRunner, when speculative decoding is on

    def enable_speculation(self, mode, name: str) -> None:
        """Turn on speculative decoding (a core.speculative.SpecMode) for model `name`.
        ValueError when the model or the cache cannot do it."""
        from deepring.core.drafters import make_drafter
        from deepring.core.runner import ModelRunner
        from deepring.core.speculative import SpecRunner

        if not mode.on:
            self.spec = None
            return
        if not isinstance(self.runner, ModelRunner):
            raise ValueError("speculative decoding needs a model (not the zero-cost runner)")
        if self.has_work:
            raise ValueError("enable speculation before adding requests")
        drafter = make_drafter(mode, self.runner.model, self.runner.pool, name)
        most = max(mode.length, getattr(drafter, "length", 1))
        if self.pool.cache.backtrack < most:
            raise ValueError(
                f"--speculative {mode} verifies up to {most} drafts: the cache keeps only "
                f"{self.pool.cache.backtrack} ring rows for rollback (CacheConfig.backtrack)"
            )
        self.spec = SpecRunner(self.runner, drafter)
        self.spec.profile(self.slots, self.blocks)

    @property
    def pool(self) -> KVCachePool | None:
        return self.runner.pool

    def enable_prefix_cache(
        self,
        config: PrefixConfig,
        *,
        identity: str,
        num_layers: int,
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> PrefixCache:
        """Turn on the prefix KV cache (core.prefix). identity names the model's weights (the
        hash chain's root); num_layers: backbone layers (exact replay's receptive field)."""
        if self.pool is None:
            raise ValueError("prefix caching needs a runner with a cache pool")
        if self.has_work:
            raise ValueError("enable the prefix cache before adding requests")
        # The drafter's window rings are part of the ring snapshots: they are named by it.
        drafter = "" if self.spec is None else self.spec.drafter.kind
        self.prefix = PrefixCache(
            self.pool, self.blocks, config, identity=identity, num_layers=num_layers, store=store,
            clock=clock, drafter=drafter,
        )  # fmt: skip
        # V4.1's decoder replay: a hit past the prompt's last KEEP tokens restarts there.
        self.prefix.decoder_keep = int(getattr(getattr(self.runner, "model", None),
                                               "decoder_keep", 0))  # fmt: skip
        self.scheduler.prefix = self.prefix
        self.scheduler.window = self.pool.layout.window
        return self.prefix

    def close(self) -> None:
        """Finish queued store writes and stop the cache's threads."""
        if self.prefix is not None:
            self.prefix.close()

    # ---- requests ------------------------------------------------------------------------------

    def _check(self, rid: int, token_ids: list[int], images=()) -> list[int]:
        """The images' span lengths (core.images.check_images); ValueError for a prompt that
        cannot be served."""
        if rid in self.requests:
            raise ValueError(f"duplicate request id {rid!r}")
        if not token_ids:
            raise ValueError("a prompt needs at least one token")
        vocab = self.vocab_size
        if images:
            vision = getattr(getattr(self.runner, "model", None), "vision_config", None)
            return check_images(token_ids, images, vision, vocab)
        # A pass in C: the listing below is only built for a prompt that fails.
        if not ids_in_range(token_ids, vocab):
            bad = [t for t in token_ids if not 0 <= t < vocab]
            raise ValueError(f"token ids out of range [0, {vocab}): {bad[:5]}")
        return []

    def add(
        self,
        rid: int,
        prompt_ids: list[int],
        params: SamplingParams,
        seed: int,
        cache_class: str = "chat",
        output_ids: list[int] | None = None,
        constraint: Constraint | None = None,
        images: Sequence[PromptImage] = (),
    ) -> Request:
        """A new request, prefilled from its longest cached prefix (or from scratch).
        cache_class: how long the store keeps its blocks ("chat" | "agent", see
        PrefixConfig). output_ids: tokens it already generated elsewhere (a request resumed
        after a fault: it continues with the next one). constraint: the grammar its output
        must match (structured output). images: V4.1 images whose spans the prompt holds
        (core.images). ValueError when it cannot be served."""
        lengths = self._check(rid, prompt_ids, images)
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len ({self.max_model_len})"
            )
        if cache_class not in CACHE_CLASSES:
            raise ValueError(f"cache class must be one of {CACHE_CLASSES}, got {cache_class!r}")
        done = list(output_ids or ())
        if len(done) >= params.max_tokens:
            raise ValueError(f"{len(done)} tokens already generated: max_tokens is reached")
        bad = [t for t in done if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"output token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        end = params.think_end_id
        if params.thinking_budget is not None and not 0 <= end < self.vocab_size:
            raise ValueError(f"think_end_id {end} is out of range [0, {self.vocab_size})")
        req = Request(
            rid=rid, prompt_ids=list(prompt_ids), params=params, seed=seed,
            cache_class=cache_class, output_ids=done, constraint=constraint,
            grammar=self._grammar_state(constraint, done),
            thinking_ended=end is not None and end in done,
        )  # fmt: skip
        attach_images(req, images, lengths)
        if self.prefix is not None:
            self.prefix.plan(req)
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
        cache_class: str = "chat",
        constraint: Constraint | None = None,
        images: Sequence[PromptImage] = (),
    ) -> Request:
        """Join a request prefilled elsewhere to the running batch. images: its prompt's, as in
        `add` (a preempted request recomputes them). ValueError when its state does not fit
        this engine (check `can_admit` first for room) or its output so far does not match its
        constraint."""
        if not 0 < prompt_len <= len(token_ids) or not 0 < num_cached <= len(token_ids):
            raise ValueError("handoff token counts are inconsistent")
        # One pass over prompt and output: the spans lie in the prompt, every other id must be
        # in the vocabulary.
        lengths = self._check(rid, token_ids, images)
        if len(token_ids) - prompt_len > params.max_tokens or (
            prompt_len + params.max_tokens > self.max_model_len
        ):
            raise ValueError("handoff exceeds max_tokens or max_model_len")
        num_blocks = state.num_blocks
        if self.blocks_for(num_cached) != num_blocks:
            raise ValueError(f"{num_cached} cached tokens cannot fill {num_blocks} blocks")
        grammar = self._grammar_state(constraint, token_ids[prompt_len:])
        slot = self.slots.allocate()
        blocks = self.blocks.allocate(num_blocks)
        try:
            import_state(self.pool, state, slot, blocks)
        except ValueError:
            self.slots.free(slot)
            self.blocks.free(blocks)
            raise
        req = Request(
            rid=rid,
            prompt_ids=list(token_ids[:prompt_len]),
            params=params,
            seed=seed,
            output_ids=list(token_ids[prompt_len:]),
            num_cached=num_cached,
            slot=slot,
            blocks=blocks,
            status=Status.RUNNING,
            cache_class=cache_class if cache_class in CACHE_CLASSES else "chat",
            constraint=constraint,
            grammar=grammar,
            # The sender's drafter context travels in the slot state (serve starts prefill and
            # decode workers with the same --speculative).
            draft_from=0 if self.spec is not None else None,
        )
        attach_images(req, images, lengths)
        if self.prefix is not None:
            self.prefix.adopt(req)
        self.requests[rid] = req
        self.scheduler.running.append(req)
        return req

    def _grammar_state(self, constraint: Constraint | None, output_ids: Sequence[int]):
        """The matcher of a constrained request that has generated output_ids (None without a
        constraint). ValueError when it cannot be enforced here."""
        if constraint is None:
            return None
        if self._grammars is None:
            if self.tokenizer_path is None:
                raise ValueError("this engine has no tokenizer to enforce output constraints with")
            self._grammars = self._new_compiler()
        return self._grammars.state(constraint, output_ids)

    def _new_compiler(self):
        from deepring.structured.runtime import GrammarCompiler

        return GrammarCompiler(self.tokenizer_path, self.vocab_size, sorted(self.eos_token_ids))

    def prepare_grammars(self) -> None:
        """Build the grammar compiler now, so that the first constrained request does not wait
        for it: workers call this before they say they are ready. llguidance's tokenizer build
        (~1.8 s for a 129k vocabulary, ad-hoc timing on the 2-core dev machine) holds the GIL;
        on a helper thread after `ready` it held up the worker's loop and its heartbeats for as
        long (~6 s on a loaded 2-core machine, long enough for the frontend to declare every
        worker dead). Offline engines build it on their first constrained request."""
        if self.tokenizer_path is None or self._grammars is not None:
            return
        try:
            self._grammars = self._new_compiler()
        except Exception as e:  # noqa: BLE001 - the first constrained request tries again and fails with it
            log.warning("structured output unavailable for now: %s", e)

    def export(self, req: Request) -> CacheState:
        if req.slot is None:
            raise ValueError(f"request {req.rid} holds no cache state")
        return export_state(self.pool, req.slot, req.blocks)

    def finish(self, req: Request, reason: str) -> None:
        """End `req` here (its slot and blocks are freed at once; published blocks stay
        cached)."""
        if not req.finished:
            if self.prefix is not None:
                self.prefix.on_finish(req)
            self.scheduler.finish(req, reason)
        self.requests.pop(req.rid, None)

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

    def append_token(self, req: Request, tok: int) -> None:
        """A token the model produced joins `req`'s output."""
        req.output_ids.append(tok)
        self.count_token(req, tok)

    def count_token(self, req: Request, tok: int) -> None:
        """Bookkeeping for a token appended to `req`'s output (core.overlap appends it first,
        before the next step's launch, and does this after)."""
        self.num_generated += 1
        if tok == req.params.think_end_id:
            req.thinking_ended = True

    def emit(
        self, req: Request, tok: int, lp: TokenLogprob | None, index: int,
        results: list[StepResult], stops: list[tuple[Request, str]],
    ) -> None:  # fmt: skip
        """The result of output token `index` of `req` (appended already), its grammar
        advanced, and its stop reason, if any, put in `stops`."""
        if req.grammar is not None and not req.grammar.advance(tok):
            # Only a runner that does not mask (the zero-cost one) gets here: the request goes
            # on unconstrained rather than failing.
            log.warning("request %s left its constraint: %s", req.rid, req.grammar.error)
            req.grammar = None
        reason = self._stop_reason(req, tok)
        if reason is not None:
            stops.append((req, reason))
        results.append(StepResult(req, tok, reason is not None, lp, index))

    def step(self) -> list[StepResult]:
        """One scheduled step. Finished requests are freed before this returns."""
        t0 = self.clock()
        if self.spec is not None:
            self.spec.plan(self.scheduler.running, self.cost.model)
        scheduled = self.scheduler.schedule()
        if not scheduled:
            if self.prefix is not None and self.scheduler.waiting:
                # Only store reads are pending: wait for one (bounded) instead of spinning.
                self.prefix.wait_reads(list(self.scheduler.waiting), timeout=0.01)
            return []
        self.num_steps += 1
        shape = StepShape.of((s.num_tokens, s.request.num_cached) for s in scheduled)
        t1 = self.clock()
        runs = self._run(scheduled)
        t2 = self.clock()
        self.compute_seconds += t2 - t1
        results, stops = [], []
        for s, run in zip(scheduled, runs, strict=True):
            req = s.request
            if not run:
                results.append(StepResult(req, None, False))
            for tok, lp in run:
                self.append_token(req, tok)
                self.emit(req, tok, lp, len(req.output_ids) - 1, results, stops)
        # Blocks are published once the tokens they hold are known (a speculative step caches
        # rows of tokens it emits in the same step), and before finished requests free them;
        # the drafter writes this step's rows into its rings first (the snapshots hold them).
        if self.spec is not None:
            t = self.clock()
            self.spec.observe()
            self.compute_seconds += self.clock() - t
        if self.prefix is not None:
            self.prefix.after_step([s.request for s in scheduled])
        for req, reason in stops:
            self.finish(req, reason)
        if self.spec is not None:
            t = self.clock()
            self.spec.after()  # the drafter: model time too
            self.compute_seconds += self.clock() - t
        t3 = self.clock()
        took = t3 - t0
        self.last_phases = (t0, t1, t2, t3)
        self.step_seconds += took
        self.cost.observe(shape, took)
        self.last_step = (shape, took)
        return results

    def _run(self, scheduled) -> list[list[tuple[int, TokenLogprob | None]]]:
        """Run the step: per scheduled request, the tokens it emits, cut at a stop (its
        cache then holds exactly the rows of the tokens kept)."""
        if self.spec is None:
            tokens = self.runner.step(scheduled)
            runs = []
            for s, tok in zip(scheduled, tokens, strict=True):
                lp, s.request.new_logprob = s.request.new_logprob, None
                runs.append([(tok, lp)] if tok is not None else [])
            return runs
        from deepring.core.speculative import kept

        runs = self.spec.verify(scheduled)
        keeps = [
            kept(s.request, run, self.eos_token_ids) for s, run in zip(scheduled, runs, strict=True)
        ]
        self.spec.commit(keeps)
        return [run[:k] for run, k in zip(runs, keeps, strict=True)]

    def _backlog_s(self, model: StepCost, budget: int) -> float:
        """Predicted seconds of the prompt work in hand (what a prefill router waits on). A
        request not admitted yet starts after the prefix the cache will likely serve it."""
        s = self.scheduler
        total = 0.0
        for r in s.running:
            if r.pending > 1:
                total += model.prompt_seconds(r.pending, r.num_cached, budget)
        for r in s.waiting:
            start = r.num_cached
            if start == 0 and s.prefix is not None:
                start = s.prefix.expected_hit(r)
            total += model.prompt_seconds(r.num_tokens - start, start, budget)
        return total

    def load(self) -> dict:
        s = self.scheduler
        model = self.cost.model
        budget = s.config.max_num_batched_tokens
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
            "compute_seconds": self.compute_seconds,
            "generated": self.num_generated,
            "preemptions": s.num_preemptions,
            "prefix_cache": self.prefix.report() if self.prefix is not None else {},
            "step_cost": model.to_wire(),
            "backlog_s": self._backlog_s(model, budget),
            # Tokens the running requests hold: a decode step's attention reads them all.
            "context_tokens": sum(r.num_tokens for r in s.running),
        }
