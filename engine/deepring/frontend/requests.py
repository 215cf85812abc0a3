"""A request as the frontend tracks it, and the sink its output goes to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from deepring.ipc.messages import Tokens
from deepring.sampling.params import SamplingParams, TokenLogprob
from deepring.structured.constraint import Constraint


class Overloaded(Exception):
    """The request queue is full (HTTP 429)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Sink(Protocol):
    """Where a request's output goes (an SSE stream or a response being accumulated)."""

    def start(self, cache_hit: int) -> None:
        """The first token is here; cache_hit prompt tokens were served from cache."""

    def tokens(
        self, ids: list[int], finish: str | None, logprobs: list[TokenLogprob] | None = None
    ) -> bool:
        """New tokens, in order; finish ("stop" | "length") with the last ones; logprobs, one
        per id, when the request asked for them. Returns True when the sink needs no more (a
        stop sequence matched): the request is then aborted."""

    def error(self, message: str, status: int = 500) -> None:
        """The request failed; nothing more will come. status: the HTTP status when nothing
        was sent yet (503: it never reached a worker)."""


@dataclass(eq=False)
class RequestState:
    rid: int
    prompt_ids: np.ndarray
    params: SamplingParams
    seed: int
    sink: Sink
    arrival: float
    queued_at: float = 0.0  # when it last entered the queue (arrival, or its last reroute)
    prefill: str | None = None
    decode: str | None = None
    stage: str = "queued"  # queued | prefill | decode
    cache_hit: int = 0
    cache_class: str = "chat"  # the prefix cache's TTL class
    uncached: int = 0  # prompt tokens the prefill worker is expected to compute (routing)
    booked: int = 0  # tokens its current workers were charged for at dispatch
    # Times resubmitted after its worker died without it streaming a token in between (a
    # request that keeps making progress is never given up, only bounded by the deadline).
    reroutes: int = 0
    progress_at: int = 0  # next_offset at its last reroute
    decode_heard: bool = False  # a token came from its decode worker (the handoff arrived)
    output_ids: list[int] = field(default_factory=list)  # every token received in order so far
    next_offset: int = 0
    received: int = 0  # tokens received (in order or not), counted on the decode worker's load
    ready_ids: list[int] = field(default_factory=list)
    # One per ready id when the request asks for log probabilities (params.logprobs).
    ready_logprobs: list[TokenLogprob] = field(default_factory=list)
    # Tokens that came ahead of their turn: offset -> (ids, their log probabilities or None).
    stash: dict[int, tuple[list[int], list[TokenLogprob] | None]] = field(default_factory=dict)
    final: tuple[str, int] | None = None
    started: bool = False
    first_at: float = 0.0
    touched: bool = False
    # The output constraint: every (re)submission carries it, and the resumed output so far
    # already matches it (the worker's matcher consumes it first).
    constraint: Constraint | None = None
    # Its images as every (re)submission carries them (deepring.image_spans.to_wire).
    images: tuple[list, bytes] = field(default_factory=lambda: ([], b""))

    def submitted_ids(self) -> np.ndarray:
        """What a prefill worker computes: the prompt, then the output so far (a request
        resumed after a fault continues from its last token)."""
        if not self.output_ids:
            return self.prompt_ids
        return np.concatenate([self.prompt_ids, np.asarray(self.output_ids, dtype=np.int32)])

    def add(self, offset: int, ids: list[int], logprobs: list[TokenLogprob] | None = None) -> None:
        """Tokens from output index `offset` on (logprobs: one per id, or None)."""
        if offset == self.next_offset:
            self._take(ids, logprobs)
            while self.next_offset in self.stash:
                self._take(*self.stash.pop(self.next_offset))
        elif offset > self.next_offset:
            self.stash[offset] = (ids, logprobs)
        # offset < next_offset: already delivered (a duplicate); drop it.

    def take_ready(self) -> tuple[list[int], list[TokenLogprob] | None]:
        """The tokens ready for the sink, and their log probabilities (None when the request
        asked for none)."""
        ids, self.ready_ids = self.ready_ids, []
        if self.params.logprobs is None:
            return ids, None
        logprobs, self.ready_logprobs = self.ready_logprobs, []
        return ids, logprobs

    def _take(self, ids: list[int], logprobs: list[TokenLogprob] | None) -> None:
        self.ready_ids.extend(ids)
        self.output_ids.extend(ids)
        self.next_offset += len(ids)
        if logprobs is not None:
            self.ready_logprobs.extend(logprobs)


class LogprobReader:
    """The log probabilities of a Tokens message (logprob_k set), entry by entry (see
    ipc.messages.Tokens)."""

    def __init__(self, msg: Tokens) -> None:
        self.ks = msg.logprob_k
        self.lps = msg.logprobs.tolist()
        self.top_ids = msg.top_ids.tolist()
        self.top_lps = msg.top_logprobs.tolist()
        self.pos = 0
        self.top = 0

    def take(self, i: int, count: int) -> list[TokenLogprob] | None:
        """Entry i's, one per token (None when it has none); entries are taken in order."""
        k = self.ks[i]
        if k < 0:
            return None
        out: list[TokenLogprob] = []
        ids, lps, t = self.top_ids, self.top_lps, self.top
        for j in range(count):
            top = list(zip(ids[t : t + k], lps[t : t + k], strict=True))
            out.append((self.lps[self.pos + j], top))
            t += k
        self.pos += count
        self.top = t
        return out
