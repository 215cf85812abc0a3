"""The engine stepped one step ahead: the next step is planned while the current one computes.

A worker's CPU work between two steps (scheduling, stop conditions, the outputs' messages,
the ring's I/O) would otherwise leave the accelerator idle. `Overlapped.step()` runs

    plan n+1  |  wait for n  |  take n's tokens  |  launch n+1  |  post n
    (n computes .................................)  (n+1 computes ...........

so that only taking the tokens and launching lie between two steps' compute; the worker's
loop does its own work (messages, sends) after `step()` returns, while n+1 computes.

Planning n+1 (the schedule, and the runner's batch: `Runner.prepare`) before n's tokens are
known assumes each of n's requests that samples goes on with one more token (`Request.ahead`);
the batch holds a placeholder for that token, which `Runner.launch` replaces by the token
itself once it is taken, so every step computes exactly what the sequential engine computes.
What is only known a step late:
- a stop token: the request is reported finished with it (post n), as sequentially; the step
  already computing holds one more row of it, whose token is dropped;
- an abort that arrives while a step holding the request computes: the request ends at once,
  the step's token for it is dropped.
Either way a finished request's slot and blocks are freed only once no computing step uses
them (`Scheduler.held`). A request that reaches max_tokens is known not to go on and is not
planned. Where the assumption is unsafe, the step after is planned only once this one is
posted (sequentially): constrained requests (their next mask needs this step's token), a
thinking budget (whether the next token is forced), speculative decoding (the drafts come from
this step), and a planned step that needs a preemption (the victim may be computing). On a
prefill worker (`hands_off`) no request is assumed to go on: one that finishes its prompt is
handed off, and the step after is planned without it. The prefix cache's bookkeeping for
step n (blocks published, ring snapshots) is done before n+1 is launched: n+1 writes the ring
rows a snapshot copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from deepring.core.engine import EngineCore, StepResult
from deepring.core.request import Request, Status
from deepring.core.scheduler import Scheduled
from deepring.cost.model import StepShape
from deepring.sampling.params import TokenLogprob

Span = tuple[str, float, float, str]  # (name, start, end, timeline thread)


@dataclass
class _Plan:
    """A step planned (while the one before computes: what can be worked out then is)."""

    scheduled: list[Scheduled]
    shape: StepShape
    # Whether the step after may be planned while this one computes: every request that
    # samples can be assumed to go on with one more token (a constrained one's next mask, or
    # whether its next token is forced, needs this step's token). On a prefill worker the
    # requests that sample are handed off instead: none goes on, the next step is planned.
    ahead: bool
    goes_on: list[Request]  # the requests that will go on with one more token (ahead)
    prepared: object  # the runner's `prepare` (its batch), made while the step before computed


@dataclass
class _Launched:
    plan: _Plan
    wait: Callable[[], list[int | None]]  # the runner's: blocks until the tokens are known
    start: float  # on the engine's clock: when its launch began
    launched: float  # when the runner's launch returned (the step computes from then on)


class Overlapped:
    """`engine` stepped one step ahead (see the module). hands_off: a prefill worker's engine,
    whose requests leave once their prompt is done (none is continued ahead). An engine
    whose runner cannot launch a step without waiting for it, or that decodes speculatively,
    steps sequentially (`EngineCore.step`)."""

    def __init__(self, engine: EngineCore, hands_off: bool = False) -> None:
        self.engine = engine
        self.hands_off = hands_off
        self.inflight: _Launched | None = None
        # The last step() call's timeline: schedule / wait / launch / post on the loop
        # thread, and the compute of the step that completed on the "compute" track (empty
        # when it stepped sequentially).
        self.spans: list[Span] = []

    @property
    def busy(self) -> bool:
        return self.inflight is not None or self.engine.has_work

    @property
    def sequential(self) -> bool:
        eng = self.engine
        return eng.spec is not None or not hasattr(eng.runner, "prepare")

    def step(self) -> list[StepResult]:
        """Results of one step: the one computing (then the next is launched before they are
        posted), or one launched now when none is."""
        eng = self.engine
        clock = eng.clock
        spans: list[Span] = []
        self.spans = spans
        if self.sequential and self.inflight is None:
            return eng.step()  # (no spans: EngineCore.last_phases has the step's)
        cur = self.inflight
        if cur is None:
            t = clock()
            planned = self._plan(eng.scheduler.schedule())
            spans.append(("schedule", t, clock(), "loop"))
            if planned is None:
                if eng.prefix is not None and eng.scheduler.waiting:
                    # Only store reads are pending: wait for one (bounded), do not spin.
                    eng.prefix.wait_reads(list(eng.scheduler.waiting), timeout=0.01)
                return []
            cur = self._launch(planned, spans)
        following = None
        if cur.plan.ahead:
            t = clock()
            following = self._plan(eng.scheduler.schedule(preempt=False))
            spans.append(("schedule", t, clock(), "loop"))
        t = clock()
        tokens = cur.wait()
        done = clock()
        spans += [("wait", t, done, "loop"), ("compute", cur.launched, done, "compute")]
        runs = self._take(cur, tokens)
        if eng.prefix is not None:
            # Before the next launch: it writes the ring rows a snapshot copies.
            eng.prefix.after_step([s.request for s in cur.plan.scheduled if not s.request.finished])
        self.inflight = self._launch(following, spans) if following else None
        t = clock()
        results = self._post(cur, runs)
        # The step's time is its launch and compute (what the next step waits on); the
        # runner's share, the compute alone.
        took = done - cur.start
        eng.step_seconds += took
        eng.compute_seconds += done - cur.launched
        eng.cost.observe(cur.plan.shape, took)
        eng.last_step = (cur.plan.shape, took)
        spans.append(("post", t, clock(), "loop"))
        return results

    def close(self) -> None:
        """Wait for a computing step (its tokens are dropped) and free what it held."""
        cur, self.inflight = self.inflight, None
        if cur is not None:
            cur.wait()
            for s in cur.plan.scheduled:
                s.request.in_flight = False
                s.request.ahead = 0
            self.engine.scheduler.release_held()

    def _plan(self, scheduled: list[Scheduled] | None) -> _Plan | None:
        """What launching `scheduled` needs that can be worked out before (the requests of
        the computing step, if any, as they will be once its tokens are taken)."""
        if not scheduled:
            return None
        ahead, goes_on = True, []
        for s in scheduled:
            r = s.request
            if r.grammar is not None or r.params.thinking_budget is not None:
                ahead = False
            # It samples (its chunk reaches its last token, the one in flight included) and
            # goes on, unless that token is its last: such a request is not planned again.
            if s.completes and len(r.output_ids) + r.ahead + 1 < r.params.max_tokens:
                goes_on.append(r)
        if self.hands_off:
            ahead, goes_on = True, []
        shape = StepShape.of((s.num_tokens, s.request.num_cached) for s in scheduled)
        prepared = self.engine.runner.prepare(scheduled)  # type: ignore[attr-defined]
        return _Plan(scheduled, shape, ahead, goes_on if ahead else [], prepared)

    def _launch(self, plan: _Plan, spans: list[Span]) -> _Launched:
        eng = self.engine
        start = eng.clock()
        eng.num_steps += 1
        for s in plan.scheduled:
            s.request.in_flight = True
        wait = eng.runner.launch(plan.scheduled, plan.prepared)  # type: ignore[attr-defined]
        launched = eng.clock()
        for r in plan.goes_on:
            r.ahead = 1
        spans.append(("launch", start, launched, "loop"))
        return _Launched(plan, wait, start, launched)

    def _take(self, cur: _Launched, tokens: list[int | None]) -> list:
        """The step's tokens join their requests' outputs: only what the next launch needs (its
        inputs are these tokens), the rest is `_post`'s. Per scheduled request (token or None,
        logprobs), None for a request that finished while the step computed (its token is
        dropped)."""
        runs: list[tuple[int | None, TokenLogprob | None] | None] = []
        finished = Status.FINISHED
        for s, tok in zip(cur.plan.scheduled, tokens, strict=True):
            r = s.request
            r.in_flight = False
            r.ahead = 0
            lp = r.new_logprob
            if lp is not None:
                r.new_logprob = None  # (a model's next step sets it again)
            if r.status is finished:
                runs.append(None)
                continue
            if tok is not None:
                r.output_ids.append(tok)
            runs.append((tok, lp))
        self.engine.scheduler.release_held()
        return runs

    def _post(self, cur: _Launched, runs: list) -> list[StepResult]:
        """The step's results: stop conditions checked, finished requests ended."""
        eng = self.engine
        results: list[StepResult] = []
        stops: list[tuple[Request, str]] = []
        for s, run in zip(cur.plan.scheduled, runs, strict=True):
            if run is None:
                continue
            tok, lp = run
            r = s.request
            if tok is None:
                results.append(StepResult(r, None, False))
                continue
            eng.count_token(r, tok)
            eng.emit(r, tok, lp, len(r.output_ids) - 1, results, stops)
        for req, reason in stops:
            eng.finish(req, reason)
        return results
