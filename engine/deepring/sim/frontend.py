"""The simulated frontend's books of its requests: what a worker's Tokens message changes.

`ReqState` is a request as the frontend (and the report) sees it. `TokenBooks` is the part of
cluster.Cluster that takes a Tokens message in, as frontend.client does: first tokens (the
prompt is off its prefill worker, its blocks are written), every gap between two tokens, the
registry's view of the decode workers (registry.grew), finished and failed requests.

Most messages come from a decode worker's steady steps (sim.fastforward): the same requests as
the worker's previous message, each past its first token and held by that worker, one token
each or one run's worth each. Such a sequence of messages is a `_Stream`: their tokens are
kept as they came (one array per message) and put on the requests' states only when something
reads them (the stream changes, one of its requests finishes, the run ends: `_settle`), and
every request of a message saw the same gap (each had its last token with the previous one).
With ClusterConfig.incremental off, every message is put on every state at once.

Gaps are kept as the report reads them, a multiset of values (TokenBooks.tbt_gaps): `gaps`
one each, and `shared_gaps` with `shared_counts`, how many requests saw each (a stream's, and
those between a run's steps).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from deepring.ipc.messages import Tokens
from deepring.routing.registry import WorkerState
from deepring.sim.trace import Session


@dataclass(slots=True)  # thousands of them, read for every message
class ReqState:
    rid: int
    session: Session
    turn: int
    prompt: np.ndarray
    arrival: float
    uncached: int = 0
    prefill: str | None = None
    decode: str | None = None
    first_at: float | None = None
    last_at: float = 0.0
    received: int = 0
    chunks: list[np.ndarray] = field(default_factory=list)  # its tokens so far, in pieces
    done_at: float | None = None
    error: str | None = None
    # The digests of the prompt's full blocks (runner.SharedBlocks.extend); once it is done,
    # of the prompt's and the answer's, with those tokens (`history`), for the next turn.
    chain: list[bytes] | None = None
    history: np.ndarray | None = None

    @property
    def output(self) -> list[int]:
        """The tokens it received."""
        return np.concatenate(self.chunks).tolist() if self.chunks else []


class _Stream:
    """A decode worker's messages for the same requests (rids, their states); `count` tokens
    each since they were last put on the states, in `parts` (one [requests, tokens] array per
    message), the last of them at `last`."""

    __slots__ = ("count", "last", "parts", "rids", "states")

    def __init__(self, rids: list[int], states: list[ReqState], last: float) -> None:
        self.rids, self.states, self.last = rids, states, last
        self.count = 0
        self.parts: list[np.ndarray] = []


class TokenBooks:
    """Cluster's Tokens handling (a mixin: it uses the cluster's requests, registry, gaps,
    shared tier and _done)."""

    def _on_tokens(self, w: WorkerState, msg: Tokens, times: list[float] | None) -> None:
        """times: when each of a run's tokens was made (sim.fastforward), else all now."""
        rids, counts = msg.rids, msg.counts
        n = len(rids)
        same = counts[0] if n else 0
        if not (n and w.role == "decode" and counts.count(same) == n):
            self._on_tokens_each(w, msg, times)
            return
        # A request's first token of the message came at `first`, its last at `last`.
        first, last = (self.now, self.now) if times is None else (times[0], times[-1])
        table = msg.token_ids.reshape(n, same)
        stream = self._books.get(w.id)
        if stream is not None and (stream.rids is rids or stream.rids == rids):
            # Each of them had its last token at stream.last: n gaps of one value.
            self.shared_gaps.append(first - stream.last)
            self.shared_counts.append(n)
            stream.count += same
            stream.last = last
            stream.parts.append(table)
        else:
            if stream is not None:
                self._settle(self._books.pop(w.id))
            states = self._plain_states(w.id, rids, stream)
            if states is None:
                self._on_tokens_each(w, msg, times)
                return
            gap = self.gaps.append
            for st, row in zip(states, table, strict=True):
                gap(first - st.last_at)
                st.last_at = last
                st.chunks.append(row)
                st.received += same
            if self.config.incremental:
                self._books[w.id] = _Stream(rids, states, last)  # (a sent message's lists stay)
        self.registry.grew_many(rids, w.id, same)
        self._after_tokens(msg, times, n)

    def _plain_states(
        self, wid: str, rids: list[int], old: _Stream | None
    ) -> list[ReqState] | None:
        """The states of rids when every one is known, past its first token and held by
        decode worker wid (None otherwise). old: wid's previous stream, whose requests are
        such (one that finished ended the stream): found in one pass, as the worker's batch
        keeps its order."""
        get, states = self.requests.get, []
        j, old_rids = 0, old.rids if old is not None else []
        for rid in rids:
            while j < len(old_rids) and old_rids[j] != rid:
                j += 1
            if j < len(old_rids):
                states.append(old.states[j])
                j += 1
                continue
            st = get(rid)
            if st is None or st.first_at is None or st.decode != wid:
                return None
            states.append(st)
        return states

    def _settle(self, stream: _Stream) -> None:
        """Put the stream's tokens on its requests' states."""
        if not stream.count:
            return
        parts = stream.parts
        table = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        last, count = stream.last, stream.count
        for st, row in zip(stream.states, table, strict=True):
            st.last_at = last
            st.received += count
            st.chunks.append(row)
        stream.count, stream.parts = 0, []

    def settle_all(self) -> None:
        """Every state up to date (the run stops: the report reads them)."""
        for stream in self._books.values():
            self._settle(stream)

    def _on_tokens_each(self, w: WorkerState, msg: Tokens, times: list[float] | None) -> None:
        """_on_tokens for any message: request by request."""
        stream = self._books.pop(w.id, None)
        if stream is not None:  # its states first
            self._settle(stream)
        now, ids, wid = self.now, msg.token_ids, w.id
        get, gap = self.requests.get, self.gaps.append
        first, last = (now, now) if times is None else (times[0], times[-1])
        shared_gaps = 0  # requests that saw the run's later steps (counted once below)
        rids, counts = msg.rids, msg.counts
        # The requests on w with the message's count: registry.grew for them in one call.
        same, held = (counts[0] if counts else 0), []
        pos = 0
        for rid, count in zip(rids, counts, strict=True):
            st = get(rid)
            end = pos + count
            if st is not None:
                if st.first_at is None:
                    self._first_token(st, w)
                else:
                    gap(first - st.last_at)
                    shared_gaps += 1
                st.last_at = last
                st.chunks.append(ids[pos:end])
                st.received += count
                if count == same and st.decode == wid:
                    held.append(rid)
                else:
                    self.registry.grew(rid, st.decode, count)
            pos = end
        if held:  # before a finished request leaves the books below
            self.registry.grew_many(held, wid, same)
        self._after_tokens(msg, times, shared_gaps)

    def _after_tokens(self, msg: Tokens, times: list[float] | None, shared_gaps: int) -> None:
        """A run's gaps between its steps (seen by `shared_gaps` requests), then the
        message's finished and failed requests."""
        if shared_gaps and times is not None:
            for a, b in itertools.pairwise(times):
                self.shared_gaps.append(b - a)
                self.shared_counts.append(shared_gaps)
        for rid, _reason, _total in msg.finished:
            st = self.requests.get(rid)
            if st is not None:
                self._done(st)
        for rid, message in msg.errors:
            st = self.requests.get(rid)
            if st is not None:
                st.error = str(message)
                self._done(st)

    def _first_token(self, st: ReqState, w: WorkerState) -> None:
        st.first_at = self.now
        self.registry.prefilled(st.rid, st.uncached, w)
        self._write(st.prompt, st.chain)  # the prefill worker wrote the prompt's blocks

    def tbt_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """Every time between two tokens of a request, as clients saw it: values, counts."""
        values = np.concatenate([np.asarray(self.gaps, dtype=float),
                                 np.asarray(self.shared_gaps, dtype=float)])  # fmt: skip
        weights = np.concatenate([np.ones(len(self.gaps)),
                                  np.asarray(self.shared_counts, dtype=float)])  # fmt: skip
        return values, weights
