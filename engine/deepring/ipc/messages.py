"""The messages on the rings, each with its own schema version.

On the wire a message is a ZeroMQ multipart message: frame 0 is a msgpack map with the type tag
`t`, the schema version `v` and the scalar fields; every payload field (token ids, cache
tensors) follows as its own raw frame, in declaration order, never inside msgpack and never
pickled. Token ids travel as little-endian int32 arrays, log probabilities as little-endian
float32 arrays, cache state as cache.transfer records
(header with layout fingerprint and checksum, then raw bytes). Sampling parameters travel as a
typed map (SamplingParams.to_wire) and are validated on arrival.

Who sends what:

    frontend -> prefill   Submit, Abort, Health, Shutdown
    frontend -> decode    Abort, Health, Shutdown
    prefill  -> decode    Handoff
    worker   -> frontend  Tokens, Health, Stats

A change that an old reader would misread bumps the message's VERSION; readers drop (and log)
messages of an unknown type or version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from deepring.sampling.params import SamplingParams
from deepring.structured.constraint import Constraint

# A typed map field: encoded with the class's to_wire, decoded (and validated) by from_wire.
SAMPLING = {"struct": SamplingParams}
# The same, and None (msgpack nil) when the request has none.
CONSTRAINT = {"struct": Constraint, "optional": True}

# Payload kinds: "ids" is an int32 token-id array, "f32" a float32 array, "raw" opaque bytes.
IDS = "ids"
F32 = "f32"
RAW = "raw"


def _no_ids() -> np.ndarray:
    return np.zeros(0, dtype=np.int32)


def _no_f32() -> np.ndarray:
    return np.zeros(0, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class Message:
    TYPE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, eq=False)
class Submit(Message):
    """A new request for a prefill worker, with the decode worker it must hand off to.
    prompt_ids ends with the num_output tokens the request already generated (a request
    resumed on another worker after a fault), 0 for a new one. constraint: the grammar its
    output must match (structured output; the resumed output so far already does)."""

    TYPE: ClassVar[str] = "submit"
    VERSION: ClassVar[int] = 6
    rid: int
    prompt_ids: np.ndarray = field(metadata={"frame": IDS})
    sampling: SamplingParams = field(metadata=SAMPLING)
    seed: int
    decode_worker: str
    decode_gen: int  # incarnation of that decode worker (stale handoffs are dropped)
    decode_addr: str  # its handoff endpoint
    cache_class: str  # prefix-cache TTL class: "chat" | "agent"
    num_output: int  # trailing tokens of prompt_ids that are output already (a resumed request)
    constraint: Constraint | None = field(default=None, metadata=CONSTRAINT)
    # The prompt's images (V4.1): [start, n_w, n_h, nbytes] each, their WebP concatenated in
    # image_data (deepring.image_spans.to_wire).
    images: list = field(default_factory=list)
    image_data: bytes = field(default=b"", metadata={"frame": RAW})


@dataclass(frozen=True, eq=False)
class Handoff(Message):
    """A prefilled request and its cache state, from prefill to decode.

    token_ids = prompt + the tokens sampled so far (the first one); the cache holds the first
    num_cached of them. slot_state is the request's window ring and compressor tails,
    block_state its paged-cache blocks: self-describing, checksummed records of
    cache.transfer (which name the pool layout they fit). constraint: as in Submit (the decode
    worker rebuilds the matcher from it and the tokens sampled so far).
    """

    TYPE: ClassVar[str] = "handoff"
    VERSION: ClassVar[int] = 7
    rid: int  # the request's id at the frontend that owns it
    # That frontend's incarnation (its Health gen), which tells a decode worker serving several
    # frontends whose request this is; 0 when the prefill worker had not heard it yet.
    frontend_gen: int
    token_ids: np.ndarray = field(metadata={"frame": IDS})
    prompt_len: int
    num_cached: int
    cache_hit: int
    sampling: SamplingParams = field(metadata=SAMPLING)
    seed: int
    decode_gen: int
    cache_class: str  # prefix-cache TTL class of the request ("chat" | "agent")
    slot_state: bytes = field(metadata={"frame": RAW})
    block_state: bytes = field(metadata={"frame": RAW})
    constraint: Constraint | None = field(default=None, metadata=CONSTRAINT)
    images: list = field(default_factory=list)  # as in Submit (a recompute needs them)
    image_data: bytes = field(default=b"", metadata={"frame": RAW})


@dataclass(frozen=True, eq=False)
class Tokens(Message):
    """New tokens of one engine step, for many requests at once.

    Request i got counts[i] tokens, starting at output index offsets[i]; the ids of all of them
    are concatenated in token_ids. finished: [rid, reason, total output tokens];
    cache_hits: [rid, prompt tokens served from cache] with a request's first token;
    errors: [rid, message] for requests the worker had to drop.

    Log probabilities: logprob_k is empty when no request in the message asked for them; else
    logprob_k[i] is -1 when request i asked for none, or k, its number of alternatives per token
    (0..20). For the entries with k >= 0, in order, logprobs holds one value per token (the
    sampled token's), top_ids / top_logprobs k per token (the k most likely, most likely first).
    """

    TYPE: ClassVar[str] = "tokens"
    VERSION: ClassVar[int] = 2
    worker: str
    rids: list
    offsets: list
    counts: list
    token_ids: np.ndarray = field(metadata={"frame": IDS})
    finished: list
    cache_hits: list
    errors: list
    logprob_k: list = field(default_factory=list)
    logprobs: np.ndarray = field(default_factory=_no_f32, metadata={"frame": F32})
    top_ids: np.ndarray = field(default_factory=_no_ids, metadata={"frame": IDS})
    top_logprobs: np.ndarray = field(default_factory=_no_f32, metadata={"frame": F32})


@dataclass(frozen=True, eq=False)
class Abort(Message):
    TYPE: ClassVar[str] = "abort"
    rids: list
    reason: str


HEALTH_STATES = ("ready", "alive", "draining", "exiting", "announce")


@dataclass(frozen=True, eq=False)
class Health(Message):
    """Liveness, both ways. A worker sends `ready` (with `info`) when it can take requests and
    `alive` every heartbeat interval; the frontend sends `alive` to every worker it knows, and
    `announce` to a worker it does not (which answers with `ready`)."""

    TYPE: ClassVar[str] = "health"
    worker: str
    gen: int
    state: str
    pid: int
    info: dict


@dataclass(frozen=True, eq=False)
class Stats(Message):
    """A worker's load, for the router and /metrics."""

    TYPE: ClassVar[str] = "stats"
    VERSION: ClassVar[int] = 6
    worker: str
    gen: int
    waiting: int  # requests queued in the worker (incl. handoffs not admitted yet)
    running: int
    free_slots: int
    num_slots: int
    used_blocks: int
    num_blocks: int
    queued_tokens: int  # prompt tokens still to compute
    steps: int
    step_seconds: float  # wall time spent in engine steps since start
    generated: int  # tokens sampled since start
    preemptions: int
    prefix_cache: dict  # the prefix cache's counters (core.prefix report; {} when it is off)
    dropped: dict  # ring messages the worker dropped since start, by reason (ipc.drops)
    # The worker's step-time model, fitted on its own steps: coefficients in seconds per unit
    # of cost.model.FEATURES (base, tokens, seqs, prefill_pairs, decode_context).
    step_cost: list
    backlog_s: float  # predicted seconds of the prompt work it holds (that model)
    # Seconds since the worker last took its messages: what reached it since (requests sent
    # to it while it ran the step before this report) is not counted in this report.
    lag_s: float
    context_tokens: int  # tokens held by its running requests (a decode step reads them all)
    # Of step_seconds, the time in the model runner (forward and sampling); and the wall time
    # of the worker's loop iterations that ran a step (ring I/O included): busy - compute is
    # the CPU time around the model (worker.timeline).
    compute_seconds: float
    busy_seconds: float
    # A rank of an expert-parallel group (worker.ep_rank.EPRank.report): its group, rank,
    # slots, group steps, rebalances and the load-balance factor; {} for a whole worker.
    expert_parallel: dict = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Shutdown(Message):
    """Stop. drain=True: finish the requests in hand first (up to timeout seconds)."""

    TYPE: ClassVar[str] = "shutdown"
    drain: bool
    timeout: float


MESSAGE_TYPES: tuple[type[Message], ...] = (
    Submit,
    Handoff,
    Tokens,
    Abort,
    Health,
    Stats,
    Shutdown,
)
