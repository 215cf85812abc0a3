"""A simulated cluster: the real scheduler, worker roles and routers, driven by simulated time.

Every worker is an EngineCore (core.engine) with a SimRunner (sim.runner) inside the real
PrefillRole / DecodeRole (worker.roles), so admission, chunking, the pacer, handoff admission
by free blocks and preemption are the serving code itself. The frontend side is the real
WorkerRegistry and router (routing/) and PrefixEstimate, called the way frontend.client calls
them (route, assign, prefilled, grew, release, report). What is simulated: time (a step lasts
what the step-time model says, on the worker's own clock), the rings (messages arrive after
`latency_s`; a handoff after `handoff_s`), the persistent cache tier (sim.runner.SharedBlocks)
and the clients (sim.trace).

Events are processed in time order (a heap; ties in the order they were made). A worker wakes
when a message reaches it idle, or when its step ends: it takes the messages that arrived, runs
one step (role.step) and sends what the step produced, stamped with the step's end. Like the
real worker loop it reports its load every `stats_interval` while busy and at once when it runs
out of work.
"""

from __future__ import annotations

import gc
import heapq
import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np

from deepring.cache.pool import CacheConfig
from deepring.core.engine import EngineCore
from deepring.core.scheduler import SchedulerConfig
from deepring.cost.model import StepCost
from deepring.cost.pacer import PacerConfig
from deepring.ipc.messages import Handoff, Health, Message, Stats, Submit, Tokens
from deepring.routing.prefix_estimate import PrefixEstimate
from deepring.routing.registry import WorkerRegistry
from deepring.sampling.params import SamplingParams
from deepring.sim import batch, fastforward
from deepring.sim.frontend import ReqState, TokenBooks, _Stream
from deepring.sim.runner import SharedBlocks, SimPrefix, SimRunner, WorkerClock
from deepring.sim.trace import Session
from deepring.worker.roles import DecodeRole, PrefillRole

VOCAB = 129280


@dataclass(frozen=True)
class ClusterConfig:
    prefill: int = 16
    decode: int = 64
    truth: dict[str, StepCost] | None = None  # per worker id; missing ones use `model`
    model: StepCost | None = None  # the step-time model of every worker
    prior: StepCost | None = None  # what their online fits start from (default: `model`)
    router: str = "cost"
    tbt_target_s: float | None = None
    ttft_target_s: float | None = None
    max_num_seqs: int = 128  # decode slots
    prefill_seqs: int = 32
    prefill_budget: int = 8192
    decode_budget: int = 2048
    max_model_len: int = 65536
    block_size: int = 128
    num_blocks: int | None = None  # per decode worker (default: max_num_seqs x 4096 tokens)
    latency_s: float = 0.0  # frontend <-> worker messages
    handoff_s: float = 0.0  # prefill -> decode, on top of the prefill step
    stats_interval: float = 0.25
    noise: float = 0.0  # relative standard deviation of a step's time
    # How long the simulation runs past the last arrival: the requests of the window drain
    # (those still running at the end are judged on what they produced).
    grace_s: float = 20.0
    warmup: float = 0.4  # the share of the arrival span left out of the measurement
    # Runs of trivial decode steps in one go (sim.fastforward); False: every step through the
    # scheduler (slower, for checking the two agree).
    fast_forward: bool = True
    # Steady decode steps outside those runs applied without the scheduler (sim.fastforward's
    # `step`); the same simulation either way, False for checking that.
    fast_steps: bool = True
    # What is carried from step to step instead of read again: a decode worker's batch
    # (sim.batch), its messages' requests at the frontend (sim.frontend), a conversation's block
    # chain (runner.SharedBlocks.extend). False: everything read and hashed again each time (the
    # same simulation, slower, for checking that).
    incremental: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prefill < 1 or self.decode < 1:
            raise ValueError("a cluster needs a prefill and a decode worker")
        if self.model is None:
            raise ValueError("give the workers' step-time model")
        if not 0 <= self.warmup < 1:
            raise ValueError("warmup is a share of the arrival span, in [0, 1)")


class _Link:
    """A role's link: what its step sends goes into the cluster's event heap."""

    def __init__(self, cluster: Cluster, worker: SimWorker) -> None:
        self.cluster, self.worker = cluster, worker

    def to_frontend(self, msg: Message, link: int = 0) -> None:
        self.cluster.push(self.worker.clock.now + self.cluster.config.latency_s, "frontend",
                          (self.worker.id, msg))  # fmt: skip

    def handoff(self, addr: str, msg: Handoff) -> None:
        target = self.cluster.workers[addr]
        self.cluster.push(self.worker.clock.now + self.cluster.config.handoff_s, "deliver",
                          (target, msg))  # fmt: skip


class SimWorker:
    def __init__(self, cluster: Cluster, wid: str, role: str, truth: StepCost, seed: int) -> None:
        c = cluster.config
        self.id, self.role_name = wid, role
        self.clock = WorkerClock()
        self.runner = SimRunner(truth, self.clock, c.noise, seed)
        self.runner.incremental = c.incremental
        decode = role == "decode"
        seqs = c.max_num_seqs if decode else c.prefill_seqs
        blocks_per_seq = -(-c.max_model_len // c.block_size)
        num_blocks = (c.num_blocks or seqs * (4096 // c.block_size) + blocks_per_seq) + 1
        pacing = (
            PacerConfig(c.tbt_target_s, c.ttft_target_s) if c.tbt_target_s is not None else None
        )
        self.engine = EngineCore(
            self.runner,
            CacheConfig(num_blocks=num_blocks, num_slots=seqs, block_size=c.block_size),
            SchedulerConfig(
                max_num_seqs=seqs,
                max_num_batched_tokens=c.decode_budget if decode else c.prefill_budget,
            ),
            max_model_len=c.max_model_len,
            vocab_size=VOCAB,
            cost_prior=c.prior or truth,
            pacing=pacing,
            clock=self.clock,
        )
        self.prefix = None if decode else SimPrefix(cluster.shared)
        if not decode:
            self.engine.scheduler.prefix = self.prefix
        cls = DecodeRole if decode else PrefillRole
        self.role = cls(self.engine, _Link(cluster, self), wid, 1)
        self.inbox: deque[Message] = deque()
        self.awake_at: float | None = None  # the end of its current step (None: idle)
        self.wake_gen = 0  # the wake event that counts (a cut run leaves a stale one)
        self.run: fastforward.Run | None = None  # a run of decode steps in progress
        self.run_steps = 0  # how many of its steps will be done
        self.next_stats = 0.0
        # Accounting over the measured window (Cluster.window).
        self.busy_s = 0.0
        self.steps: list[
            tuple[float, float, int, int, int]
        ] = []  # start, secs, decode toks, used blocks, mixed

    def info(self) -> dict:
        e = self.engine
        return {
            "role": self.role_name, "num_slots": e.slots.num_slots,
            "num_blocks": e.blocks.num_blocks - e.blocks.reserved, "block_size": e.block_size,
            "max_num_batched_tokens": e.scheduler.config.max_num_batched_tokens,
            "handoff_addr": self.id,
        }  # fmt: skip


class Cluster(TokenBooks):
    def __init__(self, config: ClusterConfig, sessions: list[Session]) -> None:
        c = self.config = config
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self.shared = SharedBlocks(c.block_size)
        self.estimate = PrefixEstimate(c.block_size)
        self.registry = WorkerRegistry(
            c.prefill, c.decode, router=c.router, tbt_target_s=c.tbt_target_s,
            clock=lambda: self.now,
        )  # fmt: skip
        self.workers: dict[str, SimWorker] = {}
        pid = itertools.count(1)
        for role, n in (("prefill", c.prefill), ("decode", c.decode)):
            for i in range(n):
                wid = f"{role}-{i}"
                truth = (c.truth or {}).get(wid, c.model)
                w = SimWorker(self, wid, role, truth, seed=c.seed * 100003 + next(pid))
                self.workers[wid] = w
                health = Health(worker=wid, gen=1, state="ready", pid=next(pid), info=w.info())
                self.registry.add(wid, health)
        self.requests: dict[int, ReqState] = {}
        self.finished: list[ReqState] = []
        # Every time between two tokens of a request, as clients see it (TokenBooks.tbt_gaps):
        # one each, and the gaps between a run's steps with how many requests saw them.
        self.gaps: list[float] = []
        self.shared_gaps: list[float] = []
        self.shared_counts: list[int] = []
        # Per decode worker: the stream of its messages (TokenBooks).
        self._books: dict[str, _Stream] = {}
        # Per (application, length): its system prompt's tokens and their chain.
        self._systems: dict[tuple[int, int], tuple[np.ndarray, list[bytes]]] = {}
        self.queue: deque[ReqState] = deque()
        self._rids = itertools.count(1)
        self.sessions = sessions
        for s in sessions:
            if s.turns:
                self.push(s.start, "arrive", (s, 0, None))
        # What the report measures: the arrivals after the warm-up (the cluster fills up:
        # conversations come back for more turns), to the last.
        starts = [s.start for s in sessions] or [0.0]
        first, last = min(starts), max(starts)
        self.window = (first + c.warmup * (last - first), last)
        self.events = 0
        self.end = self.window[1]
        # Decode load samples over the window, every sample_s: per decode worker, the
        # predicted time of a decode step of its batch now (its true model) and its KV blocks.
        self.sample_s = 0.25
        self.samples: list[tuple[list[float], list[int], int]] = []  # + requests running
        self.push(self.window[0], "sample", None)

    def push(self, t: float, kind: str, payload) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def run(self, until: float | None = None, max_events: int = 50_000_000) -> Cluster:
        """Process the events up to time `until` (default: the arrival window's end plus
        `grace_s`; turns arriving after the window are not sent); RuntimeError past
        max_events."""
        end = self.window[1] + self.config.grace_s if until is None else until
        self.end = end
        # A run keeps millions of small objects (tokens, requests) that the collector's
        # default pace would scan again and again: collect less often while it runs (nothing
        # here depends on when unreachable objects go).
        threshold = gc.get_threshold()
        gc.set_threshold(max(threshold[0], 100_000), *threshold[1:])
        try:
            self._run(end, max_events)
        finally:
            gc.set_threshold(*threshold)
            self.settle_all()
        return self

    def _run(self, end: float, max_events: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= end:
            t, _, kind, payload = heapq.heappop(heap)
            self.now = t
            self.events += 1
            if self.events > max_events:
                raise RuntimeError(f"the simulation passed {max_events} events")
            if kind == "wake":
                self._wake(*payload)
            elif kind == "frontend":
                self._on_message(*payload)
            elif kind == "deliver":
                self._deliver(*payload)
            elif kind == "sample":
                self._sample()
            else:
                self._arrive(*payload)

    # ---- the frontend ------------------------------------------------------------------------

    def _arrive(self, session: Session, k: int, prev: ReqState | None) -> None:
        if self.now > self.window[1]:
            if prev is not None:
                prev.history = prev.chain = None
            return  # the trace is over: no new load while the last requests drain
        turn = session.turns[k]
        rng = np.random.default_rng((session.sid, k))
        new = rng.integers(2000, 100_000, turn.new_tokens, dtype=np.int32)
        if prev is None:
            before, chain = self._system(session)
        else:  # the earlier turn's prompt and answer (_done kept them, with their chain)
            before, chain = prev.history, prev.chain
            prev.history = prev.chain = None
        prompt = np.concatenate([before, new])
        st = ReqState(next(self._rids), session, k, prompt, arrival=self.now)
        if self.config.incremental:
            # The chain of the prompt's full blocks: the part before's, continued.
            st.chain = self.shared.extend(chain, prompt, len(prompt) // self.config.block_size)
        st.uncached = len(prompt) - self.estimate.cached_tokens(prompt)
        self.requests[st.rid] = st
        if self.queue or not self._dispatch(st):
            self.queue.append(st)

    def _system(self, session: Session) -> tuple[np.ndarray, list[bytes]]:
        """The session's system prompt (its application's: the same for all its sessions) and
        the chain of its full blocks, made once."""
        key = (session.app, session.system_tokens)
        if key not in self._systems:
            rng = np.random.default_rng((1 << 40) + session.app)
            tokens = rng.integers(2000, 100_000, session.system_tokens, dtype=np.int32)
            chain = self.shared.extend([], tokens, len(tokens) // self.config.block_size)
            self._systems[key] = (tokens, chain)
        return self._systems[key]

    def _dispatch(self, st: ReqState) -> bool:
        n = len(st.prompt)
        pair = self.registry.route(n, st.uncached)
        if pair is None:
            return False
        p, d = pair
        turn = st.session.turns[st.turn]
        msg = Submit(
            rid=st.rid, prompt_ids=st.prompt,
            sampling=SamplingParams(temperature=0, max_tokens=turn.output_tokens, ignore_eos=True),
            seed=st.rid, decode_worker=d.id, decode_gen=1, decode_addr=d.id, cache_class="chat",
            num_output=0,
        )  # fmt: skip
        self.push(self.now + self.config.latency_s, "deliver", (self.workers[p.id], msg))
        self.registry.assign(st.rid, n, p, d, st.uncached)
        st.prefill, st.decode = p.id, d.id
        return True

    def _on_message(self, wid: str, msg: Message, times: list[float] | None = None) -> None:
        w = self.registry.get(wid)
        if w is None:
            return
        if isinstance(msg, Stats):
            self.registry.report(w, msg)
        elif isinstance(msg, Tokens):
            self._on_tokens(w, msg, times)

    def _done(self, st: ReqState) -> None:
        stream = self._books.pop(st.decode, None)  # its decode worker's: put on the states
        if stream is not None:
            self._settle(stream)
        del self.requests[st.rid]
        st.done_at = self.now
        self.registry.release(
            st.rid, len(st.prompt), st.received, st.prefill, st.decode, uncached=st.uncached
        )
        self.finished.append(st)
        chain, st.chain = st.chain, None
        if st.error is None:
            # Its prompt and answer are written; the next turn's prompt continues them.
            history = np.concatenate([st.prompt, *st.chunks])
            chain = self._write(history, chain)
            nxt = st.turn + 1
            if nxt < len(st.session.turns):
                st.history, st.chain = history, chain
                think = st.session.turns[nxt].think_s
                self.push(self.now + think, "arrive", (st.session, nxt, st))
        while self.queue and self._dispatch(self.queue[0]):
            self.queue.popleft()

    def _write(self, tokens: np.ndarray, chain: list[bytes] | None) -> list[bytes] | None:
        """The shared tier has the full blocks of these tokens now. chain: that of a prefix of
        them (None: hash them all, as without ClusterConfig.incremental); their own chain."""
        if chain is None:
            self.shared.write(tokens)
            return None
        chain = self.shared.extend(chain, tokens, len(tokens) // self.config.block_size)
        self.shared.add(chain)
        return chain

    def _sample(self) -> None:
        steps, blocks, n = [], [], 0
        for w in self.workers.values():
            if w.role_name != "decode":
                continue
            running = w.engine.scheduler.running
            context = batch.held_tokens(w.role, w.runner)
            steps.append(w.runner.truth.decode_step(len(running), context))
            blocks.append(w.engine.blocks.num_used)
            n += len(running)
        self.samples.append((steps, blocks, n))
        if self.now + self.sample_s <= self.window[1]:
            self.push(self.now + self.sample_s, "sample", None)

    # ---- the workers -------------------------------------------------------------------------

    def _wake_at(self, w: SimWorker, t: float) -> None:
        w.awake_at = t
        w.wake_gen += 1
        self.push(t, "wake", (w, w.wake_gen))

    def _deliver(self, worker: SimWorker, msg: Message) -> None:
        worker.inbox.append(msg)
        if worker.awake_at is None:
            self._wake_at(worker, self.now)
        elif worker.run is not None:
            # The worker loop takes the message after the step running now.
            steps = fastforward.cut(worker.run, self.now)
            if steps < worker.run_steps:
                worker.run_steps = steps
                self._wake_at(worker, worker.run.ends[steps - 1])

    def _wake(self, w: SimWorker, gen: int) -> None:
        if gen != w.wake_gen:
            return  # a run was cut: an earlier wake replaced this one
        t = w.clock.now = self.now
        if w.run is not None:
            self._finish_run(w)
            t = self.now
        while w.inbox:
            msg = w.inbox.popleft()
            w.role.handle(msg, 0)
            if w.prefix is not None and isinstance(msg, Submit):
                self._hint(w, msg)
        w.awake_at = None
        if w.role.busy:
            run = None
            if self.config.fast_forward and isinstance(w.role, DecodeRole):
                run = fastforward.plan(w.role, w.runner, until=w.next_stats)
            if run is not None:
                w.run, w.run_steps = run, len(run.ends)
                self._wake_at(w, run.ends[-1])
                return  # its report goes out when the run ends
            steps = w.engine.num_steps
            fast = self.config.fast_steps and isinstance(w.role, DecodeRole)
            if not (fast and fastforward.step(w.role, w.runner)):
                w.role.step()
                w.runner.batch = None  # the scheduler's step: sim.batch reads the batch again
            if w.engine.num_steps > steps:
                self._account(w, t, w.clock.now - t)
                self._wake_at(w, w.clock.now)
        now = w.clock.now
        if now >= w.next_stats or not w.role.busy:
            load = w.role.load()
            stats = Stats(worker=w.id, gen=1, dropped={}, lag_s=now - t,
                          busy_seconds=load["step_seconds"], **load)  # fmt: skip
            self.push(now + self.config.latency_s, "frontend", (w.id, stats))
            w.next_stats = now + self.config.stats_interval

    def _hint(self, w: SimWorker, msg: Submit) -> None:
        """Tell prefill worker w's SimPrefix the chain of the request it took (the cluster has
        it: SimPrefix would hash the prompt again)."""
        st = self.requests.get(msg.rid)
        local = w.role.origins.local(0, msg.rid)
        req = w.engine.requests.get(local) if local is not None else None
        if st is not None and req is not None and st.chain is not None:
            n = len(req.prompt_ids)
            if n == len(st.prompt) and not req.output_ids:  # its tokens are the prompt
                w.prefix.hint(req, st.chain[: (n - 1) // self.config.block_size])

    def _finish_run(self, w: SimWorker) -> None:
        run, steps = w.run, w.run_steps
        w.run = None
        msg = fastforward.apply(w.role, w.runner, run, steps)
        if msg is not None:
            times = run.ends[:steps]
            self.push(self.now + self.config.latency_s, "frontend", (w.id, msg, times))
        start = run.start
        for end in run.ends[:steps]:
            self._account(w, start, end - start)
            start = end

    def _account(self, w: SimWorker, start: float, secs: float) -> None:
        lo, hi = self.window
        if not lo <= start <= hi:
            return
        w.busy_s += secs
        shape, _ = w.runner.last
        decodes = w.runner.last_decodes
        mixed = int(decodes > 0 and shape.tokens > decodes)
        w.steps.append((start, secs, decodes, w.engine.blocks.num_used, mixed))
