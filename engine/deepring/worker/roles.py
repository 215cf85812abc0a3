"""What a prefill and a decode worker do with ring messages and engine steps.

Prefill: Submit -> chunked prefill under the step's token budget -> the first sampled token goes
straight to the frontend (that is the time to first token), then the request's cache state is
exported, freed here, and handed to the decode worker the router chose.

Decode: Handoff -> waits until a slot and enough free blocks exist (admission by free KV
blocks) -> joins the running batch (continuous batching); when blocks run out mid-decode the
scheduler preempts the youngest request, which is recomputed here later from its tokens.
max_tokens, EOS and stop token ids end a request in the engine and free its blocks at once; a
stop *sequence* (text) is matched by the frontend's stream processor, which then aborts the
request here.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import zmq

from deepring.cache.transfer import CacheState
from deepring.core.engine import EngineCore, StepResult
from deepring.core.images import PromptImage
from deepring.image_spans import from_wire, to_wire
from deepring.ipc.messages import Abort, Handoff, Message, Submit, Tokens
from deepring.ipc.validate import constraint_problem
from deepring.sampling.params import TokenLogprob
from deepring.worker.origins import Origins

if TYPE_CHECKING:
    from deepring.core.overlap import Overlapped

log = logging.getLogger("deepring.worker")

# Decode workers remember this many aborted request ids, to drop a handoff that arrives after
# its abort (the two come from different processes, so either can be first).
_ABORTED_MEMORY = 65536


class Link(Protocol):
    def to_frontend(self, msg: Message, link: int = 0) -> None: ...
    def handoff(self, addr: str, msg: Handoff) -> None: ...


class _Part:
    """The part of one step's outputs that goes to one frontend, under its request ids."""

    def __init__(self) -> None:
        self.rids: list[int] = []
        self.offsets: list[int] = []
        self.ids: list[int] = []
        self.finished: list[list] = []
        self.cache_hits: list[list] = []
        self.errors: list[list] = []
        self.logprob_k: list[int] = []  # filled only once a token comes with log probabilities
        self.logprobs: list[float] = []
        self.top_ids: list[int] = []
        self.top_logprobs: list[float] = []

    def token(self, rid: int, offset: int, token: int, logprobs: TokenLogprob | None) -> None:
        if logprobs is not None and not self.logprob_k:
            self.logprob_k = [-1] * len(self.rids)
        self.rids.append(rid)
        self.offsets.append(offset)
        self.ids.append(token)
        if logprobs is not None:
            lp, top = logprobs
            self.logprob_k.append(len(top))
            self.logprobs.append(lp)
            for t, v in top:
                self.top_ids.append(t)
                self.top_logprobs.append(v)
        elif self.logprob_k:
            self.logprob_k.append(-1)

    def message(self, worker: str) -> Tokens | None:
        if not (self.rids or self.finished or self.errors):
            return None
        return Tokens(
            worker=worker,
            rids=self.rids,
            offsets=self.offsets,
            counts=[1] * len(self.rids),
            token_ids=np.asarray(self.ids, dtype=np.int32),
            finished=self.finished,
            cache_hits=self.cache_hits,
            errors=self.errors,
            logprob_k=self.logprob_k,
            logprobs=np.asarray(self.logprobs, dtype=np.float32),
            top_ids=np.asarray(self.top_ids, dtype=np.int32),
            top_logprobs=np.asarray(self.top_logprobs, dtype=np.float32),
        )


class TokensOut:
    """One step's outputs, gathered into a single Tokens message per frontend. Requests are
    named by their local ids (worker.origins), translated here into the frontends' own."""

    def __init__(self, worker: str, origins: Origins) -> None:
        self.worker = worker
        self.origins = origins
        self.parts: dict[int, _Part] = {}

    def _to(self, local: int) -> tuple[_Part | None, int]:
        origin = self.origins.get(local)
        if origin is None:
            return None, 0  # its frontend is gone (reset) or it was aborted: nobody to tell
        return self.part(origin[0]), origin[1]

    def part(self, link: int) -> _Part:
        part = self.parts.get(link)
        if part is None:
            part = self.parts[link] = _Part()
        return part

    def token(
        self, local: int, offset: int, token: int, logprobs: TokenLogprob | None = None
    ) -> None:
        part, rid = self._to(local)
        if part is not None:
            part.token(rid, offset, token, logprobs)

    def cache_hit(self, local: int, hit: int) -> None:
        part, rid = self._to(local)
        if part is not None:
            part.cache_hits.append([rid, hit])

    def finish(self, local: int, reason: str, total: int) -> None:
        part, rid = self._to(local)
        if part is not None:
            part.finished.append([rid, reason, total])

    def error(self, local: int, message: str) -> None:
        part, rid = self._to(local)
        if part is not None:
            part.errors.append([rid, message])

    def messages(self) -> list[tuple[int, Tokens]]:
        out = []
        for link, part in self.parts.items():
            msg = part.message(self.worker)
            if msg is not None:
                out.append((link, msg))
        return out


class Role:
    def __init__(self, engine: EngineCore, link: Link, worker_id: str, gen: int) -> None:
        self.engine = engine
        self.link = link
        self.worker_id = worker_id
        self.gen = gen
        self.draining = False
        self.origins = Origins()
        # The incarnation (Health gen) last heard from each frontend link.
        self.frontend_gens: dict[int, int] = {}
        self.num_links = 1  # how many frontends this worker serves (worker.process sets it)
        # The engine stepped one step ahead (core.overlap; worker.process sets it unless
        # --no-overlap): None steps it sequentially.
        self.overlap: Overlapped | None = None

    @property
    def busy(self) -> bool:
        return self.engine.has_work or self.computing

    @property
    def computing(self) -> bool:
        """Whether a launched step is still computing (its results come with the next step)."""
        return self.overlap is not None and self.overlap.inflight is not None

    def engine_step(self) -> list[StepResult]:
        return self.overlap.step() if self.overlap is not None else self.engine.step()

    def handle(self, msg: Message, link: int = 0) -> None:
        """A message from frontend `link` (handoffs name their frontend themselves)."""
        if isinstance(msg, Abort):
            self.abort(msg.rids, link)
        else:
            log.warning("%s: dropped an unexpected %s message", self.worker_id, msg.TYPE)

    def frontend_heard(self, link: int, gen: int) -> None:
        self.frontend_gens[link] = gen

    def abort(self, rids: list, link: int = 0) -> None:
        for rid in rids:
            local = self.origins.local(link, rid)
            if local is not None:
                self._drop(local)

    def _drop(self, local: int) -> None:
        self.engine.abort(local)
        self.origins.pop(local)

    def reset(self, link: int | None = None) -> list[int]:
        """Drop every request of frontend `link` (of every frontend with None): the frontend
        that owned them is gone. Returns their local ids."""
        locals_ = self.origins.of_link(link)
        for local in locals_:
            self._drop(local)
        return locals_

    def _send(self, out: TokensOut) -> None:
        for link, msg in out.messages():
            self.link.to_frontend(msg, link)

    def _reject(self, link: int, rid: int, message: str) -> None:
        """An error for request `rid` of frontend `link`, which this worker does not hold."""
        out = TokensOut(self.worker_id, self.origins)
        out.part(link).errors.append([rid, message])
        self._send(out)

    def load(self) -> dict:
        return self.engine.load()


@dataclass(frozen=True)
class _Target:
    worker: str
    gen: int
    addr: str


class PrefillRole(Role):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.targets: dict[int, _Target] = {}  # by local id

    def handle(self, msg: Message, link: int = 0) -> None:
        if isinstance(msg, Submit):
            self.submit(msg, link)
        else:
            super().handle(msg, link)

    def submit(self, msg: Submit, link: int = 0) -> None:
        if self.draining:
            self._reject(link, msg.rid, "the server is shutting down")
            return
        ids = msg.prompt_ids.tolist()
        if not 0 <= msg.num_output < len(ids):
            self._reject(link, msg.rid, f"request rejected by {self.worker_id}: bad num_output")
            return
        local = self.origins.add(link, msg.rid)
        if local is None:
            self._reject(link, msg.rid, f"{self.worker_id} already holds this request id")
            return
        problem = constraint_problem(msg.constraint)
        if problem is not None:
            self.origins.pop(local)
            self._reject(link, msg.rid, f"the request was rejected: {problem}")
            return
        cut = len(ids) - msg.num_output
        try:
            # Decoded now: bytes that are no image are this request's error, not the step's.
            images = [PromptImage.from_encoded(im, decode=True)
                      for im in from_wire(msg.images, msg.image_data)]  # fmt: skip
            self.engine.add(
                local, ids[:cut], msg.sampling, msg.seed, msg.cache_class, ids[cut:],
                constraint=msg.constraint, images=images,
            )  # fmt: skip
        except ValueError as e:
            # The client sees why, not which worker (the frontend's checks should have caught
            # it; this log line says where it was not).
            log.warning("rejected request %d: %s", msg.rid, e)
            self.origins.pop(local)
            self._reject(link, msg.rid, f"the request was rejected: {e}")
            return
        self.targets[local] = _Target(msg.decode_worker, msg.decode_gen, msg.decode_addr)

    def _drop(self, local: int) -> None:
        super()._drop(local)
        self.targets.pop(local, None)

    def step(self) -> None:
        results = self.engine_step()
        out = TokensOut(self.worker_id, self.origins)
        ready = []
        for r in results:
            if r.new_token is None:
                continue
            req = r.request
            # Its output offset (0 unless it was resumed with tokens generated elsewhere).
            out.token(req.rid, r.index, r.new_token, r.logprobs)
            out.cache_hit(req.rid, req.cache_hit)
            if r.finished:  # EOS or max_tokens=1: nothing left for a decode worker
                out.finish(req.rid, req.finish_reason or "stop", len(req.output_ids))
                self.targets.pop(req.rid, None)
                self.origins.pop(req.rid)
            else:
                ready.append(req)
        # First tokens go out before the (larger, slower) handoffs.
        self._send(out)
        failed = TokensOut(self.worker_id, self.origins)
        for req in ready:
            target = self.targets.pop(req.rid, None)
            origin = self.origins.pop(req.rid)
            state = self.engine.export(req)
            self.engine.finish(req, "handoff")
            if target is None or origin is None:
                continue
            link, rid = origin
            images, image_data = to_wire([im.wire() for im in req.images])
            msg = Handoff(
                rid=rid,
                frontend_gen=self.frontend_gens.get(link, 0),
                token_ids=np.asarray(req.prompt_ids + req.output_ids, dtype=np.int32),
                prompt_len=len(req.prompt_ids),
                num_cached=req.num_cached,
                cache_hit=req.cache_hit,
                sampling=req.params,
                seed=req.seed,
                decode_gen=target.gen,
                cache_class=req.cache_class,
                slot_state=state.slot_state,
                block_state=state.block_state,
                constraint=req.constraint,
                images=images,
                image_data=image_data,
            )
            try:
                self.link.handoff(target.addr, msg)
            except zmq.Again:
                failed.part(link).errors.append(
                    [rid, f"decode worker {target.worker} is not taking handoffs"]
                )
            except (zmq.ZMQError, ValueError) as e:
                # An endpoint that does not parse, or a tcp:// one without ring keys here.
                failed.part(link).errors.append(
                    [rid, f"cannot reach decode worker {target.worker}: {e}"]
                )
        self._send(failed)


class DecodeRole(Role):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.pending: deque[tuple[int, Handoff]] = deque()  # (local id, handoff)
        self.aborted: OrderedDict[tuple[int, int], None] = OrderedDict()  # (link, rid)
        # Handoffs from a frontend incarnation not heard of yet (several frontends only),
        # with the time they stop waiting for it to say who it is.
        self.unplaced: deque[tuple[float, Handoff]] = deque()
        self.unplaced_wait = 10.0

    @property
    def busy(self) -> bool:
        return self.engine.has_work or self.computing or bool(self.pending)

    def handle(self, msg: Message, link: int = 0) -> None:
        if isinstance(msg, Handoff):
            self.receive(msg)
        else:
            super().handle(msg, link)

    def _link_of(self, frontend_gen: int) -> int | None:
        """The link of the frontend a handoff belongs to; -1 when it belongs to none of this
        worker's frontends as they are now (a frontend that restarted since); None when that
        cannot be told yet."""
        for link, gen in self.frontend_gens.items():
            if gen == frontend_gen:
                return link
        if self.num_links == 1:
            # One frontend: the handoff is its request unless the prefill worker knew the
            # frontend as another incarnation than the one this worker hears now.
            known = self.frontend_gens.get(0)
            return 0 if frontend_gen == 0 or known is None else -1
        return None

    def receive(self, msg: Handoff, wait_until: float | None = None) -> None:
        """Queue a handoff (one of a frontend incarnation not heard of yet waits for it, until
        wait_until)."""
        if msg.decode_gen != self.gen:
            log.info(
                "%s: dropped handoff %d meant for an earlier incarnation", self.worker_id, msg.rid
            )
            return
        link = self._link_of(msg.frontend_gen)
        if link is None:
            if wait_until is None:
                wait_until = time.monotonic() + self.unplaced_wait
            self.unplaced.append((wait_until, msg))
            return
        if link < 0:
            log.info("%s: dropped handoff %d of an earlier frontend", self.worker_id, msg.rid)
            return
        if (link, msg.rid) in self.aborted:
            return
        if self.draining:
            self._reject(link, msg.rid, "the server is shutting down")
            return
        local = self.origins.add(link, msg.rid)
        if local is None:
            log.warning("%s: dropped a second handoff of request %d", self.worker_id, msg.rid)
            return
        self.pending.append((local, msg))

    def frontend_heard(self, link: int, gen: int) -> None:
        super().frontend_heard(link, gen)
        if self.unplaced:
            waiting, self.unplaced = self.unplaced, deque()
            for until, h in waiting:
                self.receive(h, wait_until=until)

    def expire(self, now: float) -> None:
        """Drop handoffs that waited too long for their frontend to say who it is."""
        while self.unplaced and self.unplaced[0][0] <= now:
            _, h = self.unplaced.popleft()
            log.warning("%s: dropped handoff %d of an unknown frontend", self.worker_id, h.rid)

    def abort(self, rids: list, link: int = 0) -> None:
        for rid in rids:
            self.aborted[(link, rid)] = None
        while len(self.aborted) > _ABORTED_MEMORY:
            self.aborted.popitem(last=False)
        super().abort(rids, link)

    def _drop(self, local: int) -> None:
        if any(loc == local for loc, _ in self.pending):
            self.pending = deque(p for p in self.pending if p[0] != local)
        super()._drop(local)

    def admit(self) -> None:
        """Move waiting handoffs into the running batch while there is room. Requests the
        scheduler preempted (waiting for recompute) go first."""
        eng = self.engine
        failed = TokensOut(self.worker_id, self.origins)
        while self.pending and not eng.scheduler.waiting:
            local, h = self.pending[0]
            if not eng.can_admit(h.num_cached):
                if eng.scheduler.running:
                    break  # wait for running requests to finish
                # Nothing runs and it still does not fit: it never will.
                self.pending.popleft()
                failed.error(local, f"{self.worker_id} has no room for a request of this size")
                self.origins.pop(local)
                continue
            self.pending.popleft()
            problem = constraint_problem(h.constraint)
            if problem is not None:
                failed.error(local, f"handoff rejected by {self.worker_id}: {problem}")
                self.origins.pop(local)
                continue
            try:
                # Kept encoded: decoded only if the request is preempted and recomputed.
                images = [PromptImage.from_encoded(im) for im in from_wire(h.images, h.image_data)]
                eng.admit(
                    local,
                    h.token_ids.tolist(),
                    h.prompt_len,
                    h.num_cached,
                    h.sampling,
                    h.seed,
                    CacheState(h.slot_state, h.block_state),
                    h.cache_class,
                    constraint=h.constraint,
                    images=images,
                )
            except ValueError as e:
                failed.error(local, f"handoff rejected by {self.worker_id}: {e}")
                self.origins.pop(local)
        self._send(failed)

    def step(self) -> None:
        self.admit()
        if not (self.engine.has_work or self.computing):
            return
        out = TokensOut(self.worker_id, self.origins)
        for r in self.engine_step():
            if r.new_token is None:
                continue
            req = r.request
            # A speculative step emits several tokens of a request, each at its own index.
            out.token(req.rid, r.index, r.new_token, r.logprobs)
            if r.finished:
                out.finish(req.rid, req.finish_reason or "stop", len(req.output_ids))
                self.origins.pop(req.rid)
        self._send(out)

    def load(self) -> dict:
        d = super().load()
        d["waiting"] += len(self.pending)
        return d
