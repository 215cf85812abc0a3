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
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import zmq

from deepring.cache.transfer import CacheState
from deepring.core.engine import EngineCore
from deepring.ipc.messages import Abort, Handoff, Message, Submit, Tokens
from deepring.sampling.params import TokenLogprob

log = logging.getLogger("deepring.worker")

# Decode workers remember this many aborted request ids, to drop a handoff that arrives after
# its abort (the two come from different processes, so either can be first).
_ABORTED_MEMORY = 65536


class Link(Protocol):
    def to_frontend(self, msg: Message) -> None: ...
    def handoff(self, addr: str, msg: Handoff) -> None: ...


class TokensOut:
    """One step's outputs for the frontend, gathered into a single Tokens message."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
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

    def token(
        self, rid: int, offset: int, token: int, logprobs: TokenLogprob | None = None
    ) -> None:
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

    def finish(self, rid: int, reason: str, total: int) -> None:
        self.finished.append([rid, reason, total])

    def error(self, rid: int, message: str) -> None:
        self.errors.append([rid, message])

    def message(self) -> Tokens | None:
        if not (self.rids or self.finished or self.errors):
            return None
        return Tokens(
            worker=self.worker,
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


class Role:
    def __init__(self, engine: EngineCore, link: Link, worker_id: str, gen: int) -> None:
        self.engine = engine
        self.link = link
        self.worker_id = worker_id
        self.gen = gen
        self.draining = False

    @property
    def busy(self) -> bool:
        return self.engine.has_work

    def handle(self, msg: Message) -> None:
        if isinstance(msg, Abort):
            self.abort(msg.rids)
        else:
            log.warning("%s: dropped an unexpected %s message", self.worker_id, msg.TYPE)

    def abort(self, rids: list) -> None:
        for rid in rids:
            self.engine.abort(rid)

    def reset(self) -> list[int]:
        """Drop every request (the frontend that owned them is gone)."""
        return self.engine.abort_all()

    def _send(self, out: TokensOut) -> None:
        msg = out.message()
        if msg is not None:
            self.link.to_frontend(msg)

    def _reject(self, rid: int, message: str) -> None:
        out = TokensOut(self.worker_id)
        out.error(rid, message)
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
        self.targets: dict[int, _Target] = {}

    def handle(self, msg: Message) -> None:
        if isinstance(msg, Submit):
            self.submit(msg)
        else:
            super().handle(msg)

    def submit(self, msg: Submit) -> None:
        if self.draining:
            self._reject(msg.rid, "the server is shutting down")
            return
        ids = msg.prompt_ids.tolist()
        if not 0 <= msg.num_output < len(ids):
            self._reject(msg.rid, f"request rejected by {self.worker_id}: bad num_output")
            return
        cut = len(ids) - msg.num_output
        try:
            self.engine.add(msg.rid, ids[:cut], msg.sampling, msg.seed, msg.cache_class, ids[cut:])
        except ValueError as e:
            # The client sees why, not which worker (the frontend's checks should have caught
            # it; this log line says where it was not).
            log.warning("rejected request %d: %s", msg.rid, e)
            self._reject(msg.rid, f"the request was rejected: {e}")
            return
        self.targets[msg.rid] = _Target(msg.decode_worker, msg.decode_gen, msg.decode_addr)

    def abort(self, rids: list) -> None:
        super().abort(rids)
        for rid in rids:
            self.targets.pop(rid, None)

    def reset(self) -> list[int]:
        self.targets.clear()
        return super().reset()

    def step(self) -> None:
        results = self.engine.step()
        out = TokensOut(self.worker_id)
        ready = []
        for r in results:
            if r.new_token is None:
                continue
            req = r.request
            # Its output offset (0 unless it was resumed with tokens generated elsewhere).
            out.token(req.rid, len(req.output_ids) - 1, r.new_token, r.logprobs)
            out.cache_hits.append([req.rid, req.cache_hit])
            if r.finished:  # EOS or max_tokens=1: nothing left for a decode worker
                out.finish(req.rid, req.finish_reason or "stop", len(req.output_ids))
                self.targets.pop(req.rid, None)
            else:
                ready.append(req)
        # First tokens go out before the (larger, slower) handoffs.
        self._send(out)
        failed = TokensOut(self.worker_id)
        for req in ready:
            rid = req.rid
            target = self.targets.pop(rid, None)
            state = self.engine.export(req)
            self.engine.finish(req, "handoff")
            if target is None:
                continue
            msg = Handoff(
                rid=rid,
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
            )
            try:
                self.link.handoff(target.addr, msg)
            except zmq.Again:
                failed.error(rid, f"decode worker {target.worker} is not taking handoffs")
            except (zmq.ZMQError, ValueError) as e:
                # An endpoint that does not parse, or a tcp:// one without ring keys here.
                failed.error(rid, f"cannot reach decode worker {target.worker}: {e}")
        self._send(failed)


class DecodeRole(Role):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.pending: deque[Handoff] = deque()
        self.aborted: OrderedDict[int, None] = OrderedDict()

    @property
    def busy(self) -> bool:
        return self.engine.has_work or bool(self.pending)

    def handle(self, msg: Message) -> None:
        if isinstance(msg, Handoff):
            self.receive(msg)
        else:
            super().handle(msg)

    def receive(self, msg: Handoff) -> None:
        if msg.decode_gen != self.gen:
            log.info(
                "%s: dropped handoff %d meant for an earlier incarnation", self.worker_id, msg.rid
            )
            return
        if msg.rid in self.aborted:
            return
        if self.draining:
            self._reject(msg.rid, "the server is shutting down")
            return
        self.pending.append(msg)

    def abort(self, rids: list) -> None:
        super().abort(rids)
        drop = set(rids)
        if self.pending:
            self.pending = deque(h for h in self.pending if h.rid not in drop)
        for rid in rids:
            self.aborted[rid] = None
        while len(self.aborted) > _ABORTED_MEMORY:
            self.aborted.popitem(last=False)

    def reset(self) -> list[int]:
        rids = [h.rid for h in self.pending]
        self.pending.clear()
        return rids + super().reset()

    def admit(self) -> None:
        """Move waiting handoffs into the running batch while there is room. Requests the
        scheduler preempted (waiting for recompute) go first."""
        eng = self.engine
        failed = TokensOut(self.worker_id)
        while self.pending and not eng.scheduler.waiting:
            h = self.pending[0]
            if not eng.can_admit(h.num_cached):
                if eng.scheduler.running:
                    break  # wait for running requests to finish
                # Nothing runs and it still does not fit: it never will.
                self.pending.popleft()
                failed.error(h.rid, f"{self.worker_id} has no room for a request of this size")
                continue
            self.pending.popleft()
            try:
                eng.admit(
                    h.rid,
                    h.token_ids.tolist(),
                    h.prompt_len,
                    h.num_cached,
                    h.sampling,
                    h.seed,
                    CacheState(h.slot_state, h.block_state),
                    h.cache_class,
                )
            except ValueError as e:
                failed.error(h.rid, f"handoff rejected by {self.worker_id}: {e}")
        self._send(failed)

    def step(self) -> None:
        self.admit()
        if not self.engine.has_work:
            return
        out = TokensOut(self.worker_id)
        for r in self.engine.step():
            if r.new_token is None:
                continue
            req = r.request
            n = len(req.output_ids)
            out.token(req.rid, n - 1, r.new_token, r.logprobs)
            if r.finished:
                out.finish(req.rid, req.finish_reason or "stop", n)
        self._send(out)

    def load(self) -> dict:
        d = super().load()
        d["waiting"] += len(self.pending)
        return d
