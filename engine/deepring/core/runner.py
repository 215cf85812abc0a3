"""Runs one scheduled step: builds the batch, runs the model, samples the next tokens.

EngineCore takes any Runner: the ModelRunner here, or the zero-cost runner (core.zero_cost),
which produces tokens without a model to measure the serving stack alone.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch

from deepring.cache.pool import KVCachePool
from deepring.core.request import Request
from deepring.core.scheduler import Scheduled, advance
from deepring.model.batch import ForwardBatch, SeqChunk
from deepring.model.model import DeepseekV4
from deepring.sampling.sampler import Sampler


class Runner(Protocol):
    # The cache pool the runner's steps write (None: the runner keeps no cache state).
    pool: KVCachePool | None

    def step(self, scheduled: list[Scheduled]) -> list[int | None]:
        """Feed each request its chunk (advancing its num_cached); returns the sampled token of
        every request whose chunk completes its known tokens (None for mid-prompt chunks)."""
        ...

    def prepare(self, scheduled: list[Scheduled]) -> object:
        """What launching `scheduled` needs that can be made while the step before computes
        (its tokens, Request.ahead, are not known yet): core.overlap calls it then."""
        ...

    def launch(
        self, scheduled: list[Scheduled], prepared: object = None
    ) -> Callable[[], list[int | None]]:
        """step() started (with its `prepare`, or None): num_cached is advanced when this
        returns, and the returned function waits for the tokens (core.overlap plans the next
        step meanwhile)."""
        ...


@dataclass
class _Prepared:
    """A step's batch, built on the caller's thread (ModelRunner.launch)."""

    scheduled: list[Scheduled]
    completes: list[bool]
    batch: ForwardBatch
    sampling: list[Scheduled]  # the scheduled requests that sample a token
    # (batch row, request, its chunk) of each input token still being computed when the batch
    # was built (Request.ahead): launch puts the request's last output token there.
    pending: list[tuple[int, Request, SeqChunk]]


class ModelRunner:
    def __init__(self, model: DeepseekV4, pool: KVCachePool) -> None:
        self.model = model
        self.pool: KVCachePool = pool
        self.sampler = Sampler()
        self.block_size = pool.cache.block_size
        self.window = pool.layout.window
        self.masks = None  # structured.runtime.TokenMasks, made for the first constrained step
        self._compute_thread: ThreadPoolExecutor | None = None  # launch()'s, made on first use
        # Tokens before a chunk the model reads (V4.1's Engram n-grams; 0 for V4).
        self.context = int(getattr(model, "token_context", 0))
        # V4.1: the decoder computes only each prompt's last `keep` tokens (0: every token).
        self.keep = int(getattr(model, "decoder_keep", 0))
        if self.keep and self.keep < pool.ring_len:
            raise ValueError(
                f"DEEPRING_V41_KEEP = {self.keep} is below the window ring ({pool.ring_len} = "
                "sliding window + backtrack): decoding would read ring slots never computed"
            )

    def step(self, scheduled: list[Scheduled]) -> list[int | None]:
        """Feed each request its chunk; returns the sampled token of every request whose chunk
        completes its known tokens (None for mid-prompt chunks)."""
        prepared = self.prepare(scheduled)
        advance(scheduled)
        return self._complete(prepared, self._compute(prepared))

    def launch(
        self, scheduled: list[Scheduled], prepared: _Prepared | None = None
    ) -> Callable[[], list[int | None]]:
        """step(), with the forward and the sampler on the compute thread: returns at once (the
        batch built, num_cached advanced) with a function that waits for the tokens. Until
        then the caller changes none of the requests' output, grammar or images. prepared:
        this step's `prepare`, made while the step before computed."""
        p = prepared if prepared is not None else self.prepare(scheduled)
        if p.pending:
            # The tokens the step before computed (appended since prepare): the rows' inputs,
            # in the batch and in its chunks (a model may read them there: V4.1's Engram).
            ids = []
            for _, r, chunk in p.pending:
                tok = r.output_ids[-1]
                chunk.token_ids[-1] = tok
                ids.append(tok)
            rows = torch.tensor([row for row, _, _ in p.pending])
            p.batch.input_ids[rows.to(p.batch.input_ids.device)] = torch.tensor(ids).to(
                p.batch.input_ids.device
            )
        advance(scheduled)
        if self._compute_thread is None:
            self._compute_thread = ThreadPoolExecutor(1, thread_name_prefix="compute")
        fut = self._compute_thread.submit(self._compute, p)
        return lambda: self._complete(p, fut.result())

    def prepare(self, scheduled: list[Scheduled]) -> _Prepared:
        """The step's batch, from the requests as they are. A request whose last token a
        computing step will add (Request.ahead) feeds a placeholder, which `launch` fills in:
        the batch is built while that step computes (core.overlap)."""
        completes = [s.completes for s in scheduled]
        chunks, pending = [], []
        row = 0
        for s in scheduled:
            r = s.request
            end = r.num_cached + s.num_tokens
            ids = r.tokens(r.num_cached, end - r.ahead)
            if r.ahead:
                ids.append(0)
            row += s.num_tokens
            chunks.append(self.chunk(r, ids, "last" if s.completes else "none"))
            if r.ahead:
                pending.append((row - 1, r, chunks[-1]))
        self.image_rows(scheduled, chunks)
        batch = ForwardBatch.build(
            chunks, self.model.rope_tables(), self.block_size, self.model.device
        )
        sampling = [s for s, c in zip(scheduled, completes, strict=True) if c]
        return _Prepared(scheduled, completes, batch, sampling, pending)

    def chunk(self, r: Request, ids: list[int], logits: str) -> SeqChunk:
        """Request r's chunk of this step: `ids` from its num_cached on."""
        if r.slot is None:
            raise ValueError(f"request {r.rid} has no state slot")
        return SeqChunk(
            token_ids=ids,
            start=r.num_cached,
            slot=r.slot,
            block_ids=r.blocks,
            logits=logits,
            # A replayed window matters until one window past its floor.
            window_floor=r.window_floor if r.num_cached < r.window_floor + self.window - 1 else 0,
            compress_from=r.compress_from,
            context=r.tokens(max(0, r.num_cached - self.context), r.num_cached)
            if self.context
            else [],
            # The prompt's last KEEP tokens, also when a resumed or recomputed request
            # prefills its output too: the decoder's windows then start where the first
            # prefill started them, and the output continues exactly.
            decoder_from=max(0, len(r.prompt_ids) - self.keep) if self.keep else 0,
        )

    def _compute(self, p: _Prepared) -> list[int]:
        """The forward and the sampled tokens of the rows that sample."""
        sampling = p.sampling
        # Constrained rows (structured output): their token masks are computed while the model
        # runs, then applied to the logits; a greedy one keeps the argmax-only head's token when
        # its grammar allows it and is otherwise recomputed from its own logits, masked. The
        # greedy head returns argmax ids only: a request with penalties or logprobs needs the
        # full logits (for the whole step; the others' argmax is the same either way).
        greedy = all(s.request.params.argmax_only for s in sampling)
        pending = self._start_masks(sampling, greedy)
        try:
            out_step = self.model(p.batch, self.pool, greedy=greedy)
        finally:
            if pending is not None:
                self.masks.wait(pending)  # never leave a helper thread holding the matchers
        forced = _forced(sampling)
        if sampling and greedy:
            return self.constrained_greedy(out_step, pending, forced)
        if not sampling:
            return []
        self.constrain_logits(out_step.logits, pending, forced)
        rows = [s.request for s in sampling]
        sampled = self.sampler.sample(out_step.logits, rows)
        for r, lp in zip(rows, sampled.logprobs, strict=True):
            r.new_logprob = lp  # EngineCore.step hands it on with the token
        return sampled.tokens

    def _complete(self, p: _Prepared, tokens: list[int]) -> list[int | None]:
        out: list[int | None] = []
        it = iter(tokens)
        for s, c in zip(p.scheduled, p.completes, strict=True):
            drop_prefilled_images(s.request)
            out.append(next(it) if c else None)
        return out

    def image_rows(self, scheduled, chunks: list[SeqChunk]) -> None:
        """Give each chunk the embeddings of the image span rows it holds (SeqChunk.embeds),
        running the vision tower once over every image this step reaches first."""
        hits = []  # (request, chunk, image index, span, chunk rows) of each span a chunk holds
        for s, chunk in zip(scheduled, chunks, strict=True):
            r = s.request
            lo, hi = r.num_cached, r.num_cached + s.num_tokens
            hits += [(r, chunk, k, a, b, lo, hi) for k, (a, b) in enumerate(r.image_spans)
                     if a < hi and b > lo]  # fmt: skip
        if not hits:
            return
        need = [(r, k) for r, _, k, *_ in hits if k not in r.image_embeds]
        if need:
            images = [(r.images[k].rgb(), r.images[k].n_w, r.images[k].n_h) for r, k in need]
            for (r, k), e in zip(need, self.model.embed_images(images), strict=True):
                r.image_embeds[k] = e
            # A served image's pixels go once the tower has run (its WebP stays, for a
            # recompute): up to 5 MB each would otherwise wait out the request's prefill.
            for r, k in need:
                r.images = (*r.images[:k], r.images[k].without_pixels(), *r.images[k + 1 :])
        for r, chunk, k, a, b, lo, hi in hits:
            e = r.image_embeds[k]
            chunk.embeds.append((max(a, lo) - lo, e[max(a, lo) - a : min(b, hi) - a]))

    def constrained_greedy(self, out, pending, forced: dict[int, int]) -> list[int]:
        """The greedy head's tokens, each a grammar refuses recomputed from its own masked
        logits, and the forced ones (a spent thinking budget) put in."""
        tokens = out.greedy.tolist()
        if pending is not None:
            tokens = self.masks.fix_greedy(
                tokens, pending, self._logits_of(out.last), out.masked_greedy
            )
        for i, tok in forced.items():
            tokens[i] = tok
        return tokens

    def constrain_logits(self, logits: torch.Tensor, pending, forced: dict[int, int]) -> None:
        """Grammar masks and forced tokens applied to the logits the sampler then reads (the
        reported log probabilities include them; a forced row's token has logprob 0)."""
        if pending is not None:
            self.masks.apply(logits, pending)
        with torch.inference_mode():  # (the logits are inference tensors)
            for i, tok in forced.items():
                logits[i] = float("-inf")
                logits[i, tok] = 0.0

    def _logits_of(self, last: torch.Tensor):
        """(rows, token ids or None) -> those rows' logits of those tokens (or all)."""

        @torch.inference_mode()
        def logits(rows: list[int], ids: torch.Tensor | None) -> torch.Tensor:
            h = last[rows]
            if ids is None:
                return self.model.logits(h)
            return self.model.logits_for(h, ids.to(h.device))

        return logits

    def _start_masks(self, sampling: list[Scheduled], greedy: bool):
        states = [s.request.grammar for s in sampling]
        if all(g is None for g in states):
            return None
        if self.masks is None:
            from deepring.structured.runtime import TokenMasks

            self.masks = TokenMasks(self.model.config.vocab_size)
        # On CPU a mask computed beside the forward takes a core from it: greedy rows whose
        # grammar allowed their last argmax validate the new one first (TokenMasks.start). On a
        # GPU the host is otherwise idle during the forward, so every mask is computed ahead.
        lazy = greedy and self.model.device.type != "cuda"
        return self.masks.start(states, lazy=lazy)


def _forced(sampling: list[Scheduled]) -> dict[int, int]:
    """Rows whose thinking budget is spent: the token they must take (`</think>`). With a
    grammar, only once the grammar accepts it (the reasoning may be inside a multi-byte
    character for a token or two)."""
    out = {}
    for i, s in enumerate(sampling):
        r = s.request
        tok = r.params.forced_think_end(len(r.output_ids), r.thinking_ended)
        if tok is not None and (r.grammar is None or r.grammar.allows(tok)):
            out[i] = tok
    return out


def cpu_setup(threads: int | None) -> None:
    """CPU inference hygiene: denormals flushed (they made CPU prefill ~30x slower), and an
    explicit thread count when configured."""
    torch.set_flush_denormal(True)
    if threads is not None:
        torch.set_num_threads(threads)


def drop_prefilled_images(r: Request) -> None:
    """The vision tower's embeddings of the images r has prefilled past (a recompute runs
    the tower again)."""
    if r.image_embeds:
        for k in [k for k in r.image_embeds if r.image_spans[k][1] <= r.num_cached]:
            del r.image_embeds[k]
