"""The frontend's side of the rings: sockets, requests, and each request's token stream.

Everything runs on the frontend's event loop. The ROUTER socket's file descriptor is watched
with add_reader; one wake-up drains every waiting message, gathers the new tokens per request,
and only then hands each request its tokens in one piece. Under load that batches tokens per
delivery (fewer protocol events, fewer writes), which is what keeps the frontend ahead of the
workers.

A request's life: submit -> (queued while no worker of a role is ready) -> Submit to the chosen
prefill worker -> first token from prefill -> later tokens from decode, ordered by their
output offsets (the two workers' messages may arrive in either order) -> finished, failed, or
aborted. A worker that exits, stops answering heartbeats or says it is exiting loses the
requests it held: each is rerouted (`_reroute`), resubmitted under a new id with its prompt and
every token it streamed so far to another pair of workers (the prefix cache serves what it
can), and its stream goes on from the next token with nothing repeated or missing: sampling
depends only on (seed, position), so the continuation is the one the lost worker would have
produced. After `max_reroutes` reroutes in a row without a new token, or `reroute_deadline`
seconds, it fails with a message saying which worker and why. Another process under a live
worker's name is refused until that one is declared dead. A request no worker can take within
queue_timeout seconds (of its last queueing) fails with 503. What comes off the socket is
checked by frontend.intake first. Which workers exist and how loaded they are is kept by the
registry (routing.registry); this module tells it what happens and asks it where to send each
request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import zmq

from deepring.config import FrontendConfig
from deepring.frontend.intake import RingIntake
from deepring.frontend.metrics import Metrics
from deepring.frontend.requests import LogprobReader, Overloaded, RequestState, Sink
from deepring.image_spans import EncodedImage, keyed_prompt, to_wire
from deepring.ipc import sockets
from deepring.ipc.curve import RingSecurity
from deepring.ipc.messages import Abort, Health, Message, Shutdown, Stats, Submit, Tokens
from deepring.routing.prefix_estimate import PrefixEstimate
from deepring.routing.registry import WorkerRegistry, WorkerState
from deepring.sampling.params import SamplingParams
from deepring.structured.constraint import Constraint

log = logging.getLogger("deepring.frontend")

# Messages taken per event-loop wake-up before giving HTTP I/O a turn.
_READ_BUDGET = 256


class EngineClient:
    def __init__(self, config: FrontendConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.ctx = zmq.Context(io_threads=1)
        self.sock: zmq.Socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        tbt = config.tbt_target_ms
        self.registry = WorkerRegistry(
            config.expect_prefill,
            config.expect_decode,
            router=config.router,
            tbt_target_s=tbt / 1000 if tbt is not None else None,
        )
        self.intake = RingIntake(self.registry, self.metrics)
        self.security = RingSecurity(None)
        self._estimate = PrefixEstimate()
        self.requests: dict[int, RequestState] = {}
        self.queue: deque[RequestState] = deque()
        self.gen = random.SystemRandom().getrandbits(62) + 1
        # Request ids start at a random offset per frontend incarnation, so a restarted frontend
        # never reuses an id a worker may still hold from its predecessor.
        self._rids = itertools.count((self.gen & 0xFFFFFF) << 32)
        self._touched: list[RequestState] = []
        self._read_scheduled = False
        self._beat_handle: asyncio.TimerHandle | None = None
        self._ready_event: asyncio.Event | None = None
        self.closed = False
        # Told (worker id, pid) when a worker is declared dead for missed heartbeats: the
        # supervisor (launcher.py) kills a silent expert-parallel rank, whose group cannot step
        # without it. Other workers are only dropped: a frozen one re-registers when it thaws.
        self.on_silent: Callable[[str, int], None] | None = None

    # ---- life cycle ----------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.security = RingSecurity.load(self.config.ring_keys, self.config.insecure_ring)
        self.metrics.ring_auth_denied = lambda: self.security.denied
        self.sock = sockets.router(self.ctx, self.config.ring_addr, self.security)
        loop.add_reader(self.sock.getsockopt(zmq.FD), self._on_readable)
        self._ready_event = asyncio.Event()
        self._beat_handle = loop.call_later(self.config.heartbeat_interval, self._beat)
        self._schedule_read()

    async def wait_ready(self) -> None:
        if self._ready_event is None:
            raise RuntimeError("EngineClient.wait_ready before start()")
        await self._ready_event.wait()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._beat_handle is not None:
            self._beat_handle.cancel()
        if self.sock is not None and self.loop is not None:
            self.loop.remove_reader(self.sock.getsockopt(zmq.FD))
        self.security.close()
        self.ctx.destroy(linger=0)
        sockets.cleanup_ipc(self.config.ring_addr)

    def shutdown_workers(self, drain: bool = False, timeout: float = 0.0) -> None:
        for w in list(self.workers.values()):
            self._send(w.id, Shutdown(drain=drain, timeout=timeout))

    # ---- state ---------------------------------------------------------------------------------

    @property
    def workers(self) -> dict[str, WorkerState]:
        return self.registry.workers

    @property
    def ready(self) -> bool:
        return self.registry.ready

    def info(self, key: str):
        """A fact every worker reports the same (max_model_len, tokenizer, eos ids, ...)."""
        return self.registry.info(key)

    # ---- requests ------------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        seed: int,
        sink: Sink,
        cache_class: str = "chat",
        constraint: Constraint | None = None,
        images: Sequence[EncodedImage] = (),
    ) -> int:
        """Queue a request; its output goes to `sink`. cache_class: the prefix cache's TTL
        class ("chat" | "agent"). constraint: the grammar its output must match (structured
        output). images: its prompt's (their spans in prompt_ids). Raises Overloaded when
        full."""
        limit = self.registry.capacity + self.config.max_queued_requests
        if len(self.requests) >= limit:
            raise Overloaded(
                f"the server is at capacity ({len(self.requests)} requests in flight, "
                f"limit {limit}); retry later",
                retry_after=1,
            )
        rid = next(self._rids)
        st = RequestState(
            rid=rid,
            prompt_ids=np.asarray(prompt_ids, dtype=np.int32),
            params=params,
            seed=seed,
            sink=sink,
            arrival=time.monotonic(),
            queued_at=time.monotonic(),
            cache_class=cache_class,
            constraint=constraint,
            images=to_wire(images),
        )
        # The estimate keys an image's span by the image, as the workers' caches do.
        keyed = keyed_prompt(st.prompt_ids, images) if images else st.prompt_ids
        st.uncached = len(prompt_ids) - self._cached_estimate(keyed)
        self.requests[rid] = st
        self.metrics.prompt_tokens += len(prompt_ids)
        self.metrics.prompt_images += len(images)
        if not self._dispatch(st):
            self.queue.append(st)
        return rid

    def _cached_estimate(self, prompt_ids: np.ndarray) -> int:
        """Prompt tokens the prefix cache will likely serve (routing.prefix_estimate)."""
        bs = self.registry.router.block_size
        if self._estimate.block_size != bs:
            self._estimate = PrefixEstimate(bs)
        return self._estimate.cached_tokens(prompt_ids)

    def abort(self, rid: int, reason: str = "client disconnected") -> None:
        """Stop a request (its worker frees its blocks on its next loop turn)."""
        st = self.requests.pop(rid, None)
        if st is None:
            return
        self._release(st)
        self._abort_on_workers(st, reason)
        self.metrics.request_done("aborted")

    @property
    def queued(self) -> int:
        return len(self.queue)

    def _dispatch(self, st: RequestState) -> bool:
        ids = st.submitted_ids()
        n = len(ids)
        pair = self.registry.route(n, st.uncached)
        if pair is None:
            return False
        p, d = pair
        msg = Submit(
            rid=st.rid,
            prompt_ids=ids,
            sampling=st.params,
            seed=st.seed,
            decode_worker=d.id,
            decode_gen=d.gen,
            decode_addr=d.info.get("handoff_addr") or "",
            cache_class=st.cache_class,
            num_output=len(st.output_ids),
            constraint=st.constraint,
            images=st.images[0],
            image_data=st.images[1],
        )
        if not self._send(p.id, msg):
            return False
        st.prefill, st.decode, st.stage = p.id, d.id, "prefill"
        st.booked, st.received = n, 0
        self.registry.assign(st.rid, n, p, d, st.uncached)
        return True

    def _dispatch_queued(self) -> None:
        while self.queue:
            st = self.queue[0]
            if st.rid not in self.requests:
                self.queue.popleft()
                continue
            if not self._dispatch(st):
                return
            self.queue.popleft()

    def _release(self, st: RequestState) -> None:
        """Take a finished request off its workers' books."""
        self.registry.release(
            st.rid, st.booked, st.received, st.prefill, st.decode, uncached=st.uncached
        )
        if st.stage == "queued":
            with contextlib.suppress(ValueError):
                self.queue.remove(st)
        st.stage = "done"

    def _abort_on_workers(self, st: RequestState, reason: str) -> None:
        for wid in {st.prefill, st.decode} - {None}:
            if wid in self.workers:
                self._send(wid, Abort(rids=[st.rid], reason=reason))  # type: ignore[arg-type]

    def fail_all(self, message: str) -> None:
        for st in list(self.requests.values()):
            self._fail(st, message)

    def _fail(self, st: RequestState, message: str, status: int = 500) -> None:
        if self.requests.pop(st.rid, None) is None:
            return
        self._release(st)
        self._abort_on_workers(st, "failed")
        self.metrics.request_done("error")
        if status == 500:  # the common case, in the Sink protocol's original form
            st.sink.error(message)
        else:
            st.sink.error(message, status)

    def _expire_queued(self, now: float) -> None:
        """Fail (503) requests that waited longer than queue_timeout for a worker."""
        limit = self.config.queue_timeout
        for st in [st for st in self.queue if now - st.queued_at > limit]:
            missing = [r for r in ("prefill", "decode") if not self.registry.ready_workers(r)]
            why = (
                f"no {' or '.join(missing)} worker is available"
                if missing
                else "no worker had room for it"
            )
            self._fail(st, f"the request waited {limit:g}s and {why}; retry later", status=503)

    # ---- workers -------------------------------------------------------------------------------

    def worker_lost(self, wid: str, why: str, detail: str = "") -> None:
        """A worker is gone (exited, silent, or replaced): reroute what it held. Clients whose
        request fails in the end learn the role and why, not the worker's name or `detail` (a
        pid): those go to the log."""
        w = self.registry.remove(wid)
        if w is None:
            return
        log.warning("worker %s lost: %s%s", wid, why, f" ({detail})" if detail else "")
        self._reroute_all(w, f"the {w.role} worker serving the request {why}")
        if self._ready_event is not None and not self.ready:
            self._ready_event.clear()

    def _reroute_all(self, w: WorkerState, why: str) -> None:
        """Reroute every request `w` held: those it was prefilling or decoding, and those it
        prefilled whose decode worker has not been heard from (the handoff may have died with
        it). Oldest first: they go back to the front of the queue in arrival order."""
        lost = [
            st
            for st in self.requests.values()
            if st.rid in w.rids or (st.prefill == w.id and not st.decode_heard)
        ]
        w.rids.clear()
        for st in sorted(lost, key=lambda s: s.arrival, reverse=True):
            self._reroute(st, why)

    def _reroute(self, st: RequestState, why: str) -> None:
        """Resubmit a request whose worker was lost, with its tokens so far, under a new id
        (a late message about the old id from a worker that was only slow is then ignored)."""
        cfg = self.config
        ended = self._ended(st)
        if ended is not None:
            # Its last token had arrived, only the finish did not (the worker died, or left,
            # between the two): it is complete, not resubmitted (a worker would refuse it).
            self._abort_on_workers(st, "finished")  # (those still alive free it)
            st.final = (ended, st.next_offset)
            if not st.touched:
                st.touched = True
                self._touched.append(st)
            self._deliver()
            return
        if st.next_offset > st.progress_at:  # it got further since its last reroute
            st.reroutes, st.progress_at = 0, st.next_offset
        if st.reroutes >= cfg.max_reroutes:
            self._fail(
                st, f"{why}; the request was aborted after {st.reroutes} reroutes without progress"
            )
            return
        if time.monotonic() - st.arrival > cfg.reroute_deadline:
            self._fail(
                st, f"{why}; the request was aborted (older than {cfg.reroute_deadline:.0f}s)"
            )
            return
        self.requests.pop(st.rid, None)
        self._release(st)
        self._abort_on_workers(st, "rerouted")
        st.reroutes += 1
        old, st.rid = st.rid, next(self._rids)
        st.prefill = st.decode = None
        st.stage = "queued"
        st.stash.clear()
        st.final = None
        st.decode_heard = False
        ids = st.submitted_ids()
        st.uncached = len(ids) - self._cached_estimate(ids)
        self.requests[st.rid] = st
        self.metrics.rerouted += 1
        log.info("request %d rerouted as %d after %d tokens (%s)", old, st.rid, st.next_offset, why)
        st.queued_at = time.monotonic()
        self.queue.appendleft(st)
        self._dispatch_queued()

    def _ended(self, st: RequestState) -> str | None:
        """The finish reason of a request whose output so far already ends it (a stop token,
        or max_tokens), as the worker would have decided it; None when it goes on."""
        p = st.params
        if not st.output_ids:
            return None
        last = st.output_ids[-1]
        eos = self.registry.info("eos_token_ids") or ()
        if last in p.stop_token_ids or (not p.ignore_eos and last in eos):
            return "stop"
        return "length" if st.next_offset >= p.max_tokens else None

    def _register(self, route: bytes, wid: str, msg: Health) -> None:
        old = self.workers.get(wid)
        if old is not None and old.route != route:
            # Another process under a live worker's name: it does not replace the registered one
            # (which would fail everything that one holds); it gets the name once the registered
            # process is declared dead (its exit, `exiting`, or missed heartbeats).
            self.intake.refuse_takeover(route, old, msg)
            return
        if old is not None:
            # The same incarnation announcing again: it lost contact and dropped its requests.
            log.warning("worker %s lost contact; rerouting its requests", wid)
            self._reroute_all(
                old, f"the {old.role} worker serving the request lost contact with the frontend"
            )
            old.last_seen = time.monotonic()
            return
        try:
            self.registry.add(wid, msg, route)
        except ValueError as e:
            log.warning("%s", e)
            return
        log.info("worker %s ready (pid %d)", wid, msg.pid)
        # Who this frontend is (its incarnation), before any request: a worker serving several
        # frontends tells them apart by it (worker.roles).
        self._send(
            wid, Health(worker="frontend", gen=self.gen, state="alive", pid=os.getpid(), info={})
        )
        if self.ready and self._ready_event is not None:
            self._ready_event.set()
        self._dispatch_queued()

    def _beat(self) -> None:
        now = time.monotonic()
        for w in self.registry.silent(now, self.config.heartbeat_timeout):
            self.worker_lost(w.id, f"sent no heartbeat for {now - w.last_seen:.0f}s")
            if self.on_silent is not None:
                self.on_silent(w.id, w.pid)
        self._expire_queued(now)
        for w in list(self.workers.values()):
            self._send(
                w.id,
                Health(worker="frontend", gen=self.gen, state="alive", pid=os.getpid(), info={}),
            )
        self._dispatch_queued()
        if self.loop is not None and not self.closed:
            self._beat_handle = self.loop.call_later(self.config.heartbeat_interval, self._beat)

    # ---- the socket ----------------------------------------------------------------------------

    def _send(self, wid: str, msg: Message, route: bytes | None = None) -> bool:
        """Send to registered worker `wid` (or to the peer with routing id `route`)."""
        if route is None:
            w = self.workers.get(wid)
            route = w.route if w is not None else None
        if self.sock is None or self.closed or route is None:
            return False
        try:
            sockets.send(self.sock, msg, to=route, block=False)
        except zmq.Again:
            log.warning("ring to %s is full; dropped a %s message", wid, msg.TYPE)
            return False
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            return False
        finally:
            # Sending can consume the socket's read notification: look again soon.
            self._schedule_read()
        return True

    def _schedule_read(self) -> None:
        if not self._read_scheduled and self.loop is not None and not self.closed:
            self._read_scheduled = True
            self.loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        self._read_scheduled = False
        if self.closed or self.sock is None:
            return
        n = 0
        for frames in sockets.drain(self.sock, _READ_BUDGET):
            n += 1
            taken = self.intake.accept(frames)  # None: dropped (counted, logged)
            if taken is not None:
                self._handle(*taken)
        if n >= _READ_BUDGET:
            self._schedule_read()
        self._deliver()
        if self.queue:  # finished requests may have made room, or a send may succeed now
            self._dispatch_queued()

    def _handle(self, route: bytes, wid: str, msg: Message) -> None:
        w = self.workers.get(wid)
        if w is not None and w.route != route:
            w = None  # another incarnation than the registered one
        if isinstance(msg, Health):
            if msg.state == "ready":
                self._register(route, wid, msg)
            elif w is None:
                # A worker this frontend does not know (it restarted): ask it to introduce itself.
                self._send(
                    wid,
                    Health(
                        worker="frontend", gen=self.gen, state="announce", pid=os.getpid(), info={}
                    ),
                    route,
                )
            elif msg.state == "exiting":
                self.worker_lost(wid, "shut down")
            else:
                w.last_seen = time.monotonic()
                if msg.state == "draining" and not w.leaving:
                    log.info("worker %s is draining: no new requests for it", wid)
                    self.registry.leave(w)
            return
        if w is None:
            return  # from a worker that is gone or not registered yet
        w.last_seen = time.monotonic()
        if isinstance(msg, Tokens):
            self._on_tokens(w, msg)
        elif isinstance(msg, Stats):
            if msg.gen == w.gen:
                self.registry.report(w, msg)
        else:
            log.warning("dropped an unexpected %s message from %s", msg.TYPE, wid)

    def _on_tokens(self, w: WorkerState, msg: Tokens) -> None:
        ids = msg.token_ids
        pos = 0
        requests = self.requests
        touched = self._touched
        lps = LogprobReader(msg) if msg.logprob_k else None
        for i, (rid, offset, count) in enumerate(
            zip(msg.rids, msg.offsets, msg.counts, strict=True)
        ):
            st = requests.get(rid)
            chunk = ids[pos : pos + count]
            pos += count
            logprobs = lps.take(i, count) if lps is not None else None
            if st is None or w.id not in (st.prefill, st.decode):
                continue  # gone, or not this worker's request (a worker speaks for its own)
            if (logprobs is None) != (st.params.logprobs is None):
                self._fail(st, f"the {w.role} worker sent tokens without their log probabilities")
                continue
            if st.stage == "prefill" and w.role == "prefill":
                st.stage = "decode"  # the first token is in: the prompt is off w's queue
                self.registry.prefilled(rid, st.uncached, w)
            elif w.role == "decode":
                st.decode_heard = True  # the handoff arrived
            st.add(offset, chunk.tolist(), logprobs)
            st.received += count
            self.registry.grew(rid, st.decode, count)
            if not st.touched:
                st.touched = True
                touched.append(st)
        for rid, hit in msg.cache_hits:
            st = requests.get(rid)
            # A rerouted request keeps reporting its first hit (its usage is already out).
            if st is not None and w.id in (st.prefill, st.decode) and not st.started:
                st.cache_hit = int(hit)
                self.metrics.cached_prompt_tokens += st.cache_hit
        for rid, reason, total in msg.finished:
            st = requests.get(rid)
            if st is not None and w.id in (st.prefill, st.decode):
                st.final = (str(reason), int(total))
                if not st.touched:
                    st.touched = True
                    touched.append(st)
        for rid, message in msg.errors:
            st = requests.get(rid)
            if st is None or w.id not in (st.prefill, st.decode):
                continue
            if w.leaving and st.rid in w.rids:
                # Refused by a worker that drains to leave (sent before its `draining` was
                # heard): another worker takes it, as if this one were gone.
                w.rids.discard(st.rid)
                self._reroute(st, f"the {w.role} worker serving the request is leaving")
            else:
                self._fail(st, str(message))

    def _deliver(self) -> None:
        if not self._touched:
            return
        touched, self._touched = self._touched, []
        now = time.monotonic()
        metrics = self.metrics
        for st in touched:
            st.touched = False
            if st.rid not in self.requests:
                continue
            ids, logprobs = st.take_ready()
            final = st.final
            finish = final[0] if final is not None and st.next_offset >= final[1] else None
            if not ids and finish is None:
                continue
            if not st.started:
                st.started = True
                st.first_at = now
                metrics.ttft.observe(now - st.arrival)
                st.sink.start(st.cache_hit)
            if ids:
                metrics.tokens(len(ids), now)
            done = st.sink.tokens(ids, finish, logprobs)
            if finish is not None or done:
                self.requests.pop(st.rid, None)
                self._release(st)
                if finish is None:  # a stop sequence ended it early: free it in the engine
                    self._abort_on_workers(st, "stop")
                if st.next_offset > 1:
                    metrics.tpot.observe((now - st.first_at) / (st.next_offset - 1))
                metrics.request_done("finished")
