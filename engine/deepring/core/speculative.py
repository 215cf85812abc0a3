"""Speculative decoding: verify drafted tokens in one target forward, keep the longest accepted
prefix, roll the rest back.

A decoding request carries `drafts` (proposed by a drafter after its previous step). The
scheduler feeds [last token, drafts] as one chunk (positions c .. c + G: the prefill path of the
paged caches) and the target's logits at every row decide: row k gives the target's token y_k
for position c + k + 1 (greedy: the argmax; sampled: the deterministic sampler at that
position), draft k + 1 is accepted while it equals y_k, and the run emitted is y_0 .. y_n
(n accepted drafts plus the target's own next token). Because y_k is exactly the token plain
decoding would produce at that position given the same prefix, the output (tokens, log
probabilities, stops) is identical to decoding without speculation, greedy or sampled: the
sampler's randomness is a function of (seed, position) only. With drafts that are
deterministic (a point-mass draft distribution, as every drafter here proposes its argmax),
this also accepts each draft with probability p(draft), the rejection sampler's rate, so
nothing is lost by not using the residual-distribution resampling.

Each verified row sees the state it would have in plain decoding: penalties count the output
plus the drafts before it, a grammar mask comes from the matcher advanced through those drafts
(copies; the request's own matcher advances only with emitted tokens, in EngineCore.step), and
the sampler's position is that row's. Rows after a rejected draft are rolled back in the caches
(core.spec_rollback) and the request's num_cached counts only accepted rows, so the prefix
cache (which publishes blocks below num_cached) never sees a rejected token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from deepring.cache.allocator import BlockAllocator, SlotAllocator
from deepring.core.request import Request
from deepring.core.runner import ModelRunner, drop_prefilled_images
from deepring.core.scheduler import Scheduled
from deepring.core.spec_rollback import Span, StepRollback
from deepring.cost.model import StepCost
from deepring.model.batch import ForwardBatch, SeqChunk
from deepring.sampling.params import TokenLogprob
from deepring.sampling.sampler import SampleRow
from deepring.spec.accept import accept_greedy
from deepring.spec.profile import LinearTimes, StepsPerSecond, profile
from deepring.spec.schedule import schedule

# The start-up profile (SpecRunner.profile): requests, their position, the token they feed.
PROFILE_REQUESTS = 4
PROFILE_AT = 64
PROFILE_TOKEN = 5
# Steps dspark's drafter rests once drafting did not pay (SpecRunner.plan).
REST_STEPS = 4
REST_MAX = 64  # each consecutive rest twice as long as the last, up to this
GAIN_SMOOTHING = 0.25  # weight of the newest step's expected gain in its average (plan)

Run = list[tuple[int, TokenLogprob | None]]  # tokens a step emits for a request, in order


@dataclass
class _Pending:
    """A verify step between `verify` and `commit`/`after`."""

    scheduled: list[Scheduled]
    batch: ForwardBatch
    out: object  # model.StepOutput
    rollback: StepRollback
    spans: list[int]  # per scheduled: its span index (-1: not speculating)
    offsets: list[int]  # per scheduled: its first row in the batch
    starts: list[int]  # per scheduled: num_cached before the step
    fed: list | None = None  # what the drafter read of the step (`observe`), once it has


class SpecRunner:
    """ModelRunner's step where decoding rows carry drafts. The drafter (core.drafters) reads
    the step's hidden states or taps in `after`, and proposes the next drafts."""

    def __init__(self, runner: ModelRunner, drafter) -> None:
        self.runner = runner
        self.model = runner.model
        self.pool = runner.pool
        self.drafter = drafter
        self._pending: _Pending | None = None
        # Totals for reports and benchmarks.
        self.verified = 0  # drafts fed to the target
        self.accepted = 0  # of them, accepted
        self.spec_steps = 0  # request-steps that carried drafts
        self.scheduled_drafts = 0  # drafts the prefix scheduler kept (dspark)
        # When a list: (survival of the verified drafts, drafts accepted) per request-step
        # whose drafter reports survival (calibration measurements: bench/speculative.py).
        self.record: list[tuple[list[float], int]] | None = None
        # A decode step's seconds over (1, requests, verified drafts): the start-up profile,
        # then refined by every decode step the engine times (spec.profile.LinearTimes).
        # None (no profile): the engine's step-time model instead.
        self.step_times: LinearTimes | None = None
        self._rest = 0  # steps the drafter skips (plan: drafting did not pay)
        self._rest_len = 0  # the last rest's length (0: drafting paid last time)
        self._gain: float | None = None  # average expected gain of drafting (plan)
        # The drafter's proposals: seconds over (1, requests), measured; a prior point of
        # 0 s at no request makes one batch size's measurements scale per request until
        # others are seen (a proposal at batch 32 costs far less than 32 at batch 1).
        self.draft_times = LinearTimes([((1.0, 0.0), 0.0)], prior_weight=1.0)

    def profile(self, slots: SlotAllocator, blocks: BlockAllocator) -> None:
        """Time steps at start-up (before any request: scratch slots and blocks, given back):
        one request feeding one token, n requests one each, n requests a whole block each. The
        engine's online step-time model is no use here: in speculative steps the tokens grow
        with the requests, so its fit puts their cost on the requests, and the prefix
        scheduler would then verify every draft whatever it costs."""
        if not getattr(self.drafter, "schedules", False):
            return
        per = self.drafter.length + 1
        n = min(PROFILE_REQUESTS, slots.num_free)
        need = -(-(PROFILE_AT + per) // self.runner.block_size)
        if n < 2 or blocks.num_free < n * need:
            return
        taken = [(slots.allocate(), blocks.allocate(need)) for _ in range(n)]
        rope, dev = self.model.rope_tables(), self.model.device

        def step(tokens: int) -> None:  # 1: one request; n: n requests; n * per: n blocks
            reqs, each = (1, 1) if tokens == 1 else (n, tokens // n)
            context = [PROFILE_TOKEN] * self.runner.context  # (V4.1's Engram reads them)
            chunks = [
                SeqChunk(
                    [PROFILE_TOKEN] * each, PROFILE_AT, slot, blk, logits="all", context=context
                )
                for slot, blk in taken[:reqs]
            ]
            batch = ForwardBatch.build(chunks, rope, self.runner.block_size, dev)
            self.model(batch, self.pool, greedy=True, taps=self.drafter.taps)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        try:
            curve = profile(step, [1, n, n * per], repeats=3, budget_s=10.0)
        finally:
            for slot, blk in taken:
                slots.free(slot)
                blocks.free(blk)
        one, plain, full = (curve.seconds_at(b) for b in (1, n, n * per))
        self.step_times = LinearTimes(
            [((1.0, 1.0, 0.0), one), ((1.0, n, 0.0), plain), ((1.0, n, n * (per - 1.0)), full)]
        )

    def plan(self, running: list[Request], cost: StepCost) -> None:
        """Cut the drafts of the requests whose drafter reported survival to the lengths the
        prefix scheduler (spec.schedule, Algorithm 1) picks for the batch, against the
        steps-per-second curve of the start-up profile (or of the engine's step-time model).
        The survival is the previous step's (the drafts were proposed then), so this never
        waits on a drafter."""
        if not getattr(self.drafter, "schedules", False):
            return
        reqs = [r for r in running if r.drafts and r.survival is not None]
        if not reqs:
            return
        others = len(running) - len(reqs)  # tokens the step feeds whatever the lengths
        most = sum(len(r.drafts) for r in reqs)
        seqs = len(running)
        context = float(sum(r.num_tokens for r in running))
        if self.step_times is None:
            sps = StepsPerSecond.from_step_cost(
                cost, [seqs, seqs + most], seqs=seqs, context=context
            )
        else:
            plain = self.step_times.predict((1.0, seqs, 0.0))
            extra = self.step_times.predict((1.0, seqs, most))
            sps = StepsPerSecond([(seqs, plain), (seqs + most, extra)])
        lengths = schedule(
            [r.survival for r in reqs], lambda b: sps(b + others), [len(r.drafts) for r in reqs]
        )
        for r, n in zip(reqs, lengths, strict=True):
            r.drafts = r.drafts[:n]
            self.scheduled_drafts += n
        # The schedule takes this step's drafts as paid for. Whether drafting pays at all is
        # the drafter's time too: the gain of a step is its expected tokens per second with
        # this schedule and the drafter's measured time (scaled to the batch) over plain
        # decoding's. When the gain averaged over the last steps is not above 1, the drafter
        # rests a few steps (its context is still fed) before the batch is looked at again.
        # Averaged, not one step's: one proposal the scheduler cuts to nothing (its first
        # draft unlikely) says little about the next; at batch 1 resting on each such step
        # cost more than the drafts it saved. After a rest the first step judges afresh.
        tau = seqs + sum(sum(r.survival[:n]) for r, n in zip(reqs, lengths, strict=True))
        verify_s = 1.0 / sps(seqs + sum(lengths))
        draft_s = self.draft_times.predict((1.0, len(reqs)))
        gain = tau / (verify_s + draft_s) / (seqs * sps(seqs))
        self._gain = (
            gain if self._gain is None else self._gain + GAIN_SMOOTHING * (gain - self._gain)
        )
        if self._gain <= 1.0:
            self._rest_len = min(2 * self._rest_len, REST_MAX) if self._rest_len else REST_STEPS
            self._rest = self._rest_len
            self._gain = None
        else:
            self._rest_len = 0

    def verify(self, scheduled: list[Scheduled]) -> list[Run]:
        """Run the step; per scheduled request the tokens it emits (empty mid-prompt)."""
        t0 = time.perf_counter()
        runs = self._verify(scheduled)
        # A decode step (every request feeding its last token and its drafts, no prompt
        # chunk) is a sample of the step time plan() predicts.
        if self.step_times is not None and all(s.num_tokens - s.num_drafts == 1 for s in scheduled):
            drafts = sum(s.num_drafts for s in scheduled)
            self.step_times.add((1.0, len(scheduled), drafts), time.perf_counter() - t0)
        return runs

    def _verify(self, scheduled: list[Scheduled]) -> list[Run]:
        run = self.runner
        chunks, spans, span_of, offsets, starts = [], [], [], [], []
        offset = 0
        for s in scheduled:
            r = s.request
            known = s.num_tokens - s.num_drafts
            ids = r.tokens(r.num_cached, r.num_cached + known) + r.drafts[: s.num_drafts]
            logits = "all" if s.num_drafts else ("last" if s.completes else "none")
            chunks.append(run.chunk(r, ids, logits))
            if s.num_drafts:
                span_of.append(len(spans))
                spans.append(Span(r.slot, list(r.blocks), r.num_cached, len(ids), offset))
            else:
                span_of.append(-1)
            offsets.append(offset)
            starts.append(r.num_cached)
            offset += len(ids)
        run.image_rows(scheduled, chunks)
        batch = ForwardBatch.build(
            chunks, self.model.rope_tables(), run.block_size, self.model.device
        )
        batch.capture = [] if spans else None
        rollback = StepRollback(self.pool, self.model.config.num_hidden_layers, spans)
        # The logits rows, in batch order: every verified row of a speculating request, the
        # last row of a completing prompt chunk. Each is sampled as the request would be at
        # that row's position in plain decoding.
        rows: list[tuple[int, int]] = []  # (scheduled index, draft offset k)
        states = []
        for i, s in enumerate(scheduled):
            if s.num_drafts:
                rows.extend((i, k) for k in range(s.num_drafts + 1))
                states.extend(_draft_states(s.request, s.num_drafts))
            elif s.completes:
                rows.append((i, 0))
                states.append(s.request.grammar)
        pending = None
        if any(g is not None for g in states):
            if run.masks is None:
                from deepring.structured.runtime import TokenMasks

                run.masks = TokenMasks(self.model.config.vocab_size)
            pending = run.masks.start(states)
        greedy = all(scheduled[i].request.params.argmax_only for i, _ in rows)
        try:
            out = self.model(
                batch, self.pool, greedy=greedy, return_hidden=self.drafter.wants_hidden,
                taps=self.drafter.taps,
            )  # fmt: skip
        finally:
            if pending is not None:
                run.masks.wait(pending)
        tokens: list[int] = []
        lps: list[TokenLogprob | None] = [None] * len(rows)
        forced = _forced(scheduled, rows, states)
        if rows and greedy:
            tokens = run.constrained_greedy(out, pending, forced)
        elif rows:
            run.constrain_logits(out.logits, pending, forced)
            sampled = run.sampler.sample(
                out.logits, [_row(scheduled[i].request, k) for i, k in rows]
            )
            tokens, lps = sampled.tokens, sampled.logprobs
        ys: list[list[tuple[int, TokenLogprob | None]]] = [[] for _ in scheduled]
        for (i, _k), tok, lp in zip(rows, tokens, lps, strict=True):
            ys[i].append((tok, lp))
        runs: list[Run] = list(ys)
        spec = [i for i, s in enumerate(scheduled) if s.num_drafts]
        if spec:
            # Greedy or sampled alike: a draft stays while it equals the target's own token
            # there (module docstring), so spec.accept's greedy rule decides both.
            width = max(scheduled[i].num_drafts for i in spec)
            drafts = torch.zeros(len(spec), width, dtype=torch.long)
            target = torch.zeros(len(spec), width + 1, dtype=torch.long)
            for row, i in enumerate(spec):
                g = scheduled[i].num_drafts
                drafts[row, :g] = torch.tensor(scheduled[i].request.drafts[:g])
                target[row, : g + 1] = torch.tensor([t for t, _ in ys[i]])
            lengths = torch.tensor([scheduled[i].num_drafts for i in spec])
            n_acc, _next = accept_greedy(drafts, lengths, target)
            for i, n in zip(spec, n_acc.tolist(), strict=True):
                r = scheduled[i].request
                if self.record is not None and r.survival is not None:
                    self.record.append((r.survival[: scheduled[i].num_drafts], n))
                feedback = getattr(self.drafter, "feedback", None)
                if feedback is not None:
                    feedback(r, scheduled[i].num_drafts, n)
                runs[i] = ys[i][: n + 1]
                self.verified += scheduled[i].num_drafts
                self.accepted += n
                self.spec_steps += 1
        self._pending = _Pending(scheduled, batch, out, rollback, span_of, offsets, starts)
        return runs

    def commit(self, keeps: list[int]) -> None:
        """keeps[i]: how many of scheduled i's run tokens the engine keeps (a stop inside the
        run cuts it). Rolls the caches back to the kept rows and advances num_cached."""
        p = self._pending
        if p is None:
            raise RuntimeError("commit without a verify step")
        accepted = []
        for s, span, keep in zip(p.scheduled, p.spans, keeps, strict=True):
            r = s.request
            if span >= 0:
                # Rows c .. c + keep - 1 fed the last token and the accepted drafts.
                accepted.append(keep)
                r.num_cached += keep
            else:
                r.num_cached += s.num_tokens
            drop_prefilled_images(r)
        p.rollback.restore(accepted, p.batch.capture)
        p.batch.capture = None

    def observe(self) -> None:
        """The drafter reads the step's accepted rows into its context. Call once the emitted
        tokens are appended and before the prefix cache snapshots the rings (core.prefix):
        the drafter's window rings are in the snapshot, which must hold this step's rows."""
        p = self._pending
        if p is None or p.fed is not None:
            return
        p.fed = []
        for s, off, start in zip(p.scheduled, p.offsets, p.starts, strict=True):
            r = s.request
            if r.finished or r.slot is None:
                continue
            p.fed.append((r, start, r.num_cached - start, off))
        self.drafter.observe(p.out, p.fed)

    def after(self) -> None:
        """The drafter proposes the next drafts of every request still decoding (reading the
        step first if `observe` was not called). Call once finished requests are finished."""
        self.observe()
        p, self._pending = self._pending, None
        if p is None:
            return
        fed = [f for f in p.fed if not f[0].finished and f[0].slot is not None]
        decoding = [r for r, *_ in fed if r.pending == 1]
        for r, _start, _n, _off in fed:
            if r.pending != 1:
                r.drafts, r.survival = [], None
        if self._rest > 0:
            self._rest -= 1
            for r in decoding:
                r.drafts, r.survival = [], None
            decoding = []
        if decoding:
            t0 = time.perf_counter()
            prop = self.drafter.propose(decoding)
            for i, r in enumerate(decoding):
                r.drafts = list(prop.drafts[i])
                r.survival = list(prop.survival[i]) if prop.survival is not None else None
                _fit_drafts(r, self.model.config.vocab_size)
            # (the .tolist() of the proposal synchronised the device: this is its time; fitted
            # over many, so one slow step on a shared machine does not send the drafter to rest)
            self.draft_times.add((1.0, len(decoding)), time.perf_counter() - t0)


def _draft_states(req: Request, n: int) -> list:
    """The grammar state of each verified row: the request's matcher, then copies advanced
    through its first k drafts (None rows when unconstrained)."""
    if req.grammar is None:
        return [None] * (n + 1)
    from deepring.structured.runtime import GrammarState

    out = [req.grammar]
    cur = req.grammar.matcher
    for d in req.drafts[:n]:
        cur = cur.deep_copy()
        cur.consume_token(d)  # refused drafts were cut when proposed (_fit_drafts)
        out.append(GrammarState(cur))
    return out


def _forced(scheduled: list[Scheduled], rows: list[tuple[int, int]], states) -> dict[int, int]:
    """Verified rows whose thinking budget is spent (runner._forced, row by row): the output
    there is the request's plus the drafts before the row, and `</think>` is forced once the
    row's grammar state accepts it."""
    out = {}
    for j, ((i, k), state) in enumerate(zip(rows, states, strict=True)):
        r = scheduled[i].request
        p = r.params
        if p.thinking_budget is None:
            continue
        ended = r.thinking_ended or p.think_end_id in r.drafts[:k]
        tok = p.forced_think_end(len(r.output_ids) + k, ended)
        if tok is not None and (state is None or state.allows(tok)):
            out[j] = tok
    return out


def _row(req: Request, k: int):
    """The sampler's view of verified row k: the request as plain decoding would hold it with
    its first k drafts already output (penalties count them, the draw is at that position)."""
    if k == 0:
        return req
    return SampleRow(req.params, req.seed, req.num_tokens + k, req.output_ids + req.drafts[:k])


def _fit_drafts(req: Request, vocab: int) -> None:
    """Cut a request's drafts where verifying more is pointless: past its max_tokens, past a
    token its grammar refuses (the masked target can never emit it), or out of range."""
    room = req.params.max_tokens - len(req.output_ids) - 1
    drafts = req.drafts[: max(room, 0)]
    for i, d in enumerate(drafts):
        if not 0 <= d < vocab:
            drafts = drafts[:i]
            break
    if req.grammar is not None and drafts:
        m = req.grammar.matcher.deep_copy()
        for i, d in enumerate(drafts):
            if not m.consume_token(d):
                drafts = drafts[:i]
                break
    req.drafts = drafts
    if req.survival is not None:
        req.survival = req.survival[: len(drafts)]


def kept(req: Request, run: Run, eos: frozenset[int]) -> int:
    """How many tokens of `run` the request takes before a stop: EOS or a stop token (kept,
    and the run ends there) or max_tokens."""
    p = req.params
    n = len(req.output_ids)
    for i, (tok, _lp) in enumerate(run):
        n += 1
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in eos) or n >= p.max_tokens:
            return i + 1
    return len(run)
