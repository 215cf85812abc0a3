"""The process loop shared by prefill and decode workers: `run_worker(config)`.

Start-up: load the model (or the zero-cost runner), connect to the frontend, announce `ready`
with what the frontend needs (limits, tokenizer path, handoff endpoint). Then, until told to
stop: take every waiting message, run one engine step when there is work, and send a heartbeat
(plus a load report) every interval; while busy, load reports go out more often for the router.

Liveness both ways: a supervised worker (started by `deepring serve`) exits when its parent
process is gone; any worker that hears nothing from the frontend for the heartbeat timeout
drops its requests (their owner is gone) and keeps announcing itself until a frontend answers.
Heavy imports (torch, the model) happen inside run_worker so importing this module is cheap
for the frontend that spawns it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from deepring import env
from deepring.config import WorkerConfig
from deepring.core.images import image_support
from deepring.ipc import drops, sockets
from deepring.ipc.codec import MessageError, decode_strict
from deepring.ipc.curve import RingSecurity
from deepring.ipc.messages import Abort, Handoff, Health, Message, Shutdown, Stats, Submit
from deepring.ipc.validate import worker_route
from deepring.logs import setup_logging
from deepring.worker.timeline import Timeline

if TYPE_CHECKING:
    from deepring.core.build import BuiltEngine

log = logging.getLogger("deepring.worker")


def engine_info(config: WorkerConfig, built: BuiltEngine) -> dict:
    """What a worker tells the frontend when it is ready: limits, tokenizer, model family."""
    spec, eng = config.engine, built.engine
    tok = built.tokenizer_file
    return {
        "role": config.role,
        "handoff_addr": config.advertised_handoff,
        "model": spec.model,
        "model_type": built.config.model_type,
        "random_weights": built.random_weights,
        "zero_cost": spec.zero_cost,
        "max_model_len": eng.max_model_len,
        "vocab_size": eng.vocab_size,
        "eos_token_ids": sorted(eng.eos_token_ids),
        "num_slots": eng.slots.num_slots,
        "num_blocks": spec.total_blocks,
        "block_size": eng.block_size,
        "max_num_batched_tokens": eng.scheduler.config.max_num_batched_tokens,
        "tokenizer": str(tok) if tok is not None else None,
        "device": _device_of(built),
        "images": image_support(built.model),
    }


def _device_of(built: BuiltEngine) -> str:
    pool = built.engine.pool
    if pool is not None:
        return str(pool.device)
    return "none (zero-cost)" if built.model is None else str(built.model.device)


# What each socket takes; anything else is dropped and counted. The handoff socket is open to
# every prefill host, so it takes handoffs and nothing else: no Shutdown, no Health, no Abort.
_FROM_FRONTEND = {
    "prefill": (Submit, Abort, Health, Shutdown),
    "decode": (Abort, Health, Shutdown),
}
_FROM_PREFILL = (Handoff,)


class WorkerLink:
    """A worker's sockets: a DEALER to each frontend (link i is the i-th of
    config.frontend_addrs), the handoff PULL (decode) and the handoff PUSHes (prefill, one per
    decode endpoint, connected on first use). `gen` is the incarnation, part of the routing id
    every frontend knows this process by."""

    def __init__(self, config: WorkerConfig, gen: int) -> None:
        self.security = RingSecurity.load(config.ring_keys, config.insecure_ring)
        self.drops = drops.DropLog(log, config.worker_id)
        self._from_frontend = _FROM_FRONTEND[config.role]
        self.ctx = zmq.Context(io_threads=1)
        route = worker_route(config.worker_id, gen)
        self.frontends: list[zmq.Socket] = []
        try:
            for addr in config.frontend_addrs:
                self.frontends.append(sockets.dealer(self.ctx, addr, route, self.security))
            self.handoff_in = None
            if config.role == "decode":
                self.handoff_in = sockets.pull(
                    self.ctx,
                    config.handoff_bind,  # type: ignore[arg-type]
                    self.security,
                )
        except BaseException:
            self.close()
            raise
        self._out: dict[str, zmq.Socket] = {}
        now = time.monotonic()
        self.heard_at = [now] * len(self.frontends)  # when each frontend was last heard from
        self._silent_after = 3 * config.heartbeat_interval
        self.stalled: set[int] = set()  # links whose output had to be dropped
        self.poller = zmq.Poller()
        for sock in self.frontends:
            self.poller.register(sock, zmq.POLLIN)
        if self.handoff_in is not None:
            self.poller.register(self.handoff_in, zmq.POLLIN)

    def to_frontend(self, msg: Message, link: int = 0) -> None:
        """Send request output to frontend `link`. A frontend that reads slowly holds the
        worker back (the send blocks at the high-water mark), unless it has also been silent
        for a while with other frontends to serve: then it is presumed gone, the message is
        dropped, and the link is marked stalled (the loop drops its requests, as after a
        heartbeat timeout), so one dead frontend cannot stop a worker that others share."""
        sock = self.frontends[link]
        if len(self.frontends) == 1:
            sockets.send(sock, msg)
            return
        try:
            sockets.send(sock, msg, block=False)
        except zmq.Again:
            if time.monotonic() - self.heard_at[link] < self._silent_after:
                sockets.send(sock, msg)
            else:
                self.stalled.add(link)

    def notify(self, msg: Message, link: int) -> bool:
        """Heartbeats and load reports: never wait for them (a frontend that is gone would
        stop the worker once its queue is full); the next one follows soon. False when the
        message could not be queued."""
        try:
            sockets.send(self.frontends[link], msg, block=False)
        except zmq.Again:
            return False
        return True

    def handoff(self, addr: str, msg: Handoff) -> None:
        sock = self._out.get(addr)
        if sock is None:
            sock = self._out[addr] = sockets.push(self.ctx, addr, self.security)
        sockets.send(sock, msg, block=False)

    def poll(self, timeout: float) -> tuple[list[tuple[int, Message]], set[int]]:
        """Waiting messages as (link, message) after up to `timeout` seconds (link -1: the
        handoff socket), and the links whose frontend sent any."""
        events = dict(self.poller.poll(int(timeout * 1000)))
        out: list[tuple[int, Message]] = []
        heard: set[int] = set()
        for link, sock in enumerate(self.frontends):
            if sock not in events:
                continue
            for frames in sockets.drain(sock):
                if link not in heard:
                    heard.add(link)
                    self.heard_at[link] = time.monotonic()
                msg = self._accept(frames, self._from_frontend, "a frontend")
                if msg is not None:
                    out.append((link, msg))
        if self.handoff_in is not None and self.handoff_in in events:
            for frames in sockets.drain(self.handoff_in, copy=False):
                msg = self._accept(frames, _FROM_PREFILL, "the handoff socket")
                if msg is not None:
                    out.append((-1, msg))
        return out, heard

    def _accept(self, frames: list, types: tuple[type[Message], ...], source: str):
        """The message in `frames` when it is one of `types`; else None (dropped, counted)."""
        try:
            msg = decode_strict(frames)
        except MessageError as e:
            self.drops.drop(drops.MALFORMED, source, str(e))
            return None
        if not isinstance(msg, types):
            self.drops.drop(drops.UNEXPECTED, source, f"a {msg.TYPE} message")
            return None
        return msg

    def close(self) -> None:
        self.security.close()
        self.ctx.destroy(linger=0)


class _StopFlag:
    """SIGTERM / SIGINT for an unsupervised worker: drain, then exit. A supervised worker
    ignores both (the parent drains the server and then tells it to stop)."""

    def __init__(self, supervised: bool) -> None:
        self.requested = False
        handler = signal.SIG_IGN if supervised else self._set
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _set(self, signum: int, frame: object) -> None:
        self.requested = True


def run_spare(config: WorkerConfig, conn, name: str) -> int:
    """Entry point of a spare (`deepring serve --reserve-workers`): load the model, say so on
    `conn`, and wait there for the WorkerConfig of the worker to become (the supervisor sends
    a failed worker's); then run as that worker, without loading anything again. Exits when
    the supervisor closes `conn` or goes away."""
    setup_logging(name)
    from deepring.core.build import load_weights

    loaded = load_weights(config.engine)
    conn.send("loaded")
    log.info("loaded; waiting to take over a worker (pid %d)", os.getpid())
    while True:
        if config.parent_pid is not None and os.getppid() != config.parent_pid:
            return 0
        try:
            if not conn.poll(1.0):
                continue
            role = conn.recv()
        except (EOFError, OSError):
            return 0
        if not isinstance(role, WorkerConfig):
            return 0
        spec, mine = role.engine, config.engine
        same = (spec.model, spec.dtype, spec.device, spec.load_format, spec.quantised,
                spec.seed) == (
            mine.model, mine.dtype, mine.device, mine.load_format, mine.quantised, mine.seed,
        )  # fmt: skip
        return run_worker(role, loaded if same else None)


SWITCH_INTERVAL_S = 0.0002  # the GIL's hand-over period with the overlapped engine


def trace_file(config: WorkerConfig) -> Path | None:
    """Where this worker writes its step timeline (None: it writes none)."""
    if config.trace_dir is None:
        return None
    return Path(config.trace_dir) / f"{config.worker_id}.trace.json"


def run_worker(config: WorkerConfig, loaded=None) -> int:
    """Entry point of a prefill or decode process (loaded: its model, already loaded)."""
    setup_logging(config.worker_id)
    stop = _StopFlag(supervised=config.parent_pid is not None)
    from deepring.core.build import build_engine
    from deepring.worker.ep_rank import TICK_POLL_S, GroupLost
    from deepring.worker.roles import DecodeRole, PrefillRole

    if config.ep is not None and loaded is None:
        from deepring.worker.ep_rank import load_rank

        loaded = load_rank(config.engine, config.ep)  # this rank's experts only
    built = build_engine(config.engine, loaded=loaded)
    built.engine.prepare_grammars()  # ready before the first constrained request arrives
    ep_rank = None
    if config.ep is not None:  # (before `ready`: the group forms before any rank serves)
        from deepring.worker.ep_rank import EPRank

        ep_rank = EPRank(config.ep, built.model)
    gen = random.SystemRandom().getrandbits(62) + 1
    link = WorkerLink(config, gen)
    role_cls = PrefillRole if config.role == "prefill" else DecodeRole
    role = role_cls(built.engine, link, config.worker_id, gen)
    links = range(len(config.frontend_addrs))
    role.num_links = len(links)
    if isinstance(role, DecodeRole):
        role.unplaced_wait = config.heartbeat_timeout
    info = engine_info(config, built)
    pid = os.getpid()

    def health(state: str, i: int) -> None:
        ready = state == "ready"
        sent = link.notify(
            Health(
                worker=config.worker_id,
                gen=gen,
                state=state,
                pid=pid,
                info=info if ready else {},
            ),
            i,
        )
        if ready:
            # Until a `ready` is on its way, the frontend does not know this worker dropped
            # its requests (it reroutes them when it hears one): the heartbeats say `ready`.
            unannounced[i] = not sent

    def stats() -> None:
        msg = Stats(
            expert_parallel=ep_rank.report() if ep_rank is not None else {},
            worker=config.worker_id,
            gen=gen,
            dropped=dict(link.drops.counts),
            lag_s=max(0.0, time.monotonic() - polled_at),
            busy_seconds=busy[0] + (eng.clock() - busy[1] if busy[1] is not None else 0.0),
            **role.load(),
        )
        for i in links:
            link.notify(msg, i)

    def drop_link(i: int, why: str) -> None:
        dropped = role.reset(i)
        lost[i] = True
        log.warning("%s %s; dropped %d requests", where(i), why, len(dropped))
        health("ready", i)

    def where(i: int) -> str:
        return "the frontend" if len(links) == 1 else f"frontend {config.frontend_addrs[i]}"

    polled_at = time.monotonic()  # when the loop last took its messages (Stats.lag_s)
    lost = [False] * len(links)  # a frontend not heard from for the heartbeat timeout
    unannounced = [False] * len(links)  # see health()
    for i in links:
        health("ready", i)
    handoffs = f", handoffs on {config.handoff_bind}" if config.role == "decode" else ""
    log.info(
        "ready (%s, pid %d%s)", "zero-cost" if config.engine.zero_cost else "model", pid, handoffs
    )
    now = time.monotonic()
    next_beat = now + config.heartbeat_interval
    next_stats = now
    frontend_gen: list[int | None] = [None] * len(links)
    drain_until: float | None = None
    eng = built.engine
    timeline = Timeline(trace_file(config), config.worker_id, clock=eng.clock)
    # Wall time the worker has been busy (Stats.busy_seconds): from a step's start until the
    # loop has nothing in flight and nothing to do; idle waits for messages are not counted.
    busy = [0.0, None]  # [closed periods, start of the open one]
    # The overlapped engine (config.overlap, core.overlap): each step is planned while the one
    # before computes, and the loop's own work (messages, sends, heartbeats) runs while the
    # step it launched computes. An expert-parallel rank steps in lockstep with its group (its
    # tick is a collective): sequentially.
    if config.overlap and ep_rank is None:
        from deepring.core.overlap import Overlapped

        role.overlap = Overlapped(eng, hands_off=isinstance(role, PrefillRole))
        # The compute thread (a model's forward on the CPU) and this one share the GIL: at the
        # default 5 ms switch interval a step's launch waiting behind the loop's work would
        # lose most of what the overlap gains.
        sys.setswitchinterval(SWITCH_INTERVAL_S)

    def stepped(steps_before: int) -> bool:
        spans = role.overlap.spans if role.overlap is not None else []
        if eng.num_steps == steps_before and not any(n == "compute" for n, *_ in spans):
            return False  # only admissions
        shape = eng.last_step[0] if eng.last_step else None
        args = {"tokens": shape.tokens, "seqs": shape.seqs} if shape else {}
        for name, start, end, thread in spans:
            timeline.add(name, start, end, args if name == "compute" else None, thread)
        if not spans:  # stepped sequentially
            timeline.step(eng.last_phases, args)
        return True

    try:
        while True:
            waited = not role.busy
            timeout = max(0.0, next_beat - time.monotonic()) if waited else 0.0
            if ep_rank is not None:
                timeout = min(timeout, TICK_POLL_S)
            with timeline.span("poll"):
                msgs, heard = link.poll(timeout)
            ran = False
            now = polled_at = time.monotonic()
            handled = eng.clock()
            for i in heard:
                if lost[i]:
                    log.info("%s is back", where(i))
                    lost[i] = False
            for i, msg in msgs:
                if isinstance(msg, Health):
                    new_owner = frontend_gen[i] not in (None, msg.gen)
                    frontend_gen[i] = msg.gen
                    role.frontend_heard(i, msg.gen)
                    if new_owner or msg.state == "announce":
                        # A new frontend, or one that does not know this worker (it was declared
                        # dead): whatever this worker holds for it has no owner any more.
                        dropped = role.reset(i)
                        if dropped:
                            log.warning(
                                "re-registering; dropped %d orphaned requests", len(dropped)
                            )
                        health("ready", i)
                elif isinstance(msg, Shutdown):
                    # From any frontend: only a supervising `deepring serve` sends it.
                    if not msg.drain:
                        log.info("shutting down")
                        return 0
                    role.draining = True
                    drain_until = now + msg.timeout
                else:
                    role.handle(msg, max(i, 0))
            if msgs:
                timeline.add("messages", handled, eng.clock(), {"n": len(msgs)})
            if ep_rank is not None:
                before = eng.num_steps
                if busy[1] is None and role.busy:
                    busy[1] = eng.clock()
                if ep_rank.tick(role):
                    ran = stepped(before)
            elif role.busy:
                before = eng.num_steps
                if busy[1] is None:
                    busy[1] = eng.clock()
                with timeline.span("step"):
                    role.step()
                ran = stepped(before)
            if ran:
                now = time.monotonic()
                # The step that empties the worker reports at once: a router reading the last
                # busy report would wait on work that is done until the next heartbeat.
                if now >= next_stats or not role.busy:
                    stats()
                    next_stats = now + config.stats_interval
            while link.stalled:
                drop_link(link.stalled.pop(), "stopped reading")
            if now >= next_beat:
                for i in links:
                    state = "draining" if role.draining else "alive"
                    health("ready" if lost[i] or unannounced[i] else state, i)
                stats()
                if isinstance(role, DecodeRole):
                    role.expire(now)
                next_beat = now + config.heartbeat_interval
            if config.parent_pid is not None and os.getppid() != config.parent_pid:
                log.warning("parent process %d is gone; exiting", config.parent_pid)
                return 0
            for i in links:
                silent = now - link.heard_at[i]
                if not lost[i] and silent > config.heartbeat_timeout:
                    drop_link(i, f"sent nothing for {silent:.0f}s")
            if stop.requested and drain_until is None:
                log.info("signal received: draining")
                role.draining = True
                drain_until = now + env.drain_timeout()
            # An expert-parallel rank leaves once the whole group is idle: its peers' steps
            # need its collectives until then.
            idle = not (ep_rank.group_busy if ep_rank is not None else role.busy)
            if drain_until is not None and (idle or now >= drain_until):
                log.info("drained; exiting")
                for i in links:
                    health("exiting", i)
                return 0
            if busy[1] is not None and not role.busy:
                busy[0] += eng.clock() - busy[1]
                busy[1] = None
    except GroupLost as e:
        log.error("%s; exiting so that the group restarts together", e)
        return 3
    finally:
        if ep_rank is not None:
            ep_rank.close()
        if role.overlap is not None:  # a step still computing: let it end
            with contextlib.suppress(Exception):
                role.overlap.close()
        timeline.close()
        link.close()
        role.engine.close()  # the prefix cache's queued store writes land before exit
