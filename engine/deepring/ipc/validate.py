"""What a well-formed message from a worker looks like, beyond its field types.

The codec checks types (an int is an int); this module checks meaning: the routing id a worker
connects with names the worker and its incarnation, a `ready` carries the facts the frontend
will rely on (with sane types and bounds), a load report holds non-negative counts that fit
together, and a Tokens message's lists line up with its token ids. Each check returns None for
a good message and a short reason otherwise; the caller drops and counts the message.

Routing ids: a worker's DEALER connects as `<role>-<index>/<gen in hex>`, e.g.
`decode-0/3f9c2a71d05b88e1`. The incarnation in the routing id means a restarted process (or
any other process claiming the same worker name) is a different ZeroMQ peer from the one
registered, so it can neither take over the live worker's connection nor be mistaken for it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from deepring.config import ROLES, check_address
from deepring.cost.model import StepCost
from deepring.ipc.messages import HEALTH_STATES, Health, Stats, Tokens
from deepring.sampling.params import LOGPROB_FLOOR, MAX_TOP_LOGPROBS
from deepring.structured.constraint import MAX_GRAMMAR_CHARS, Constraint

_ROUTE = re.compile(rb"(prefill|decode)-(\d{1,6})/([0-9a-f]{1,16})")
# Metric label and name material: what a prefix-cache counter may be called.
_COUNTER_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

# Bounds far above any real deployment and far below what would overflow a float or a C int.
_MAX_COUNT = 2**53
_MAX_ID = 2**64
_MAX_PID = 2**31
_MAX_TEXT = 4096
_MAX_PREFIX_KEYS = 128
_FINISH_REASONS = frozenset({"stop", "length"})


def worker_route(worker_id: str, gen: int) -> bytes:
    """The ZeroMQ routing id of one incarnation of a worker."""
    return f"{worker_id}/{gen:x}".encode()


def parse_route(route: bytes) -> tuple[str, int] | None:
    """(worker id, incarnation) of a routing id, or None when it does not follow the scheme."""
    m = _ROUTE.fullmatch(route)
    if m is None:
        return None
    return f"{m.group(1).decode()}-{int(m.group(2))}", int(m.group(3), 16)


def _is_int(v: Any, lo: int = 0, hi: int = _MAX_COUNT) -> bool:
    return type(v) is int and lo <= v < hi


def _is_count(v: Any) -> bool:
    return _is_int(v) or (type(v) is float and math.isfinite(v) and 0 <= v < _MAX_COUNT)


def _is_text(v: Any, limit: int = _MAX_TEXT) -> bool:
    return isinstance(v, str) and len(v) <= limit


def health_problem(route: bytes, msg: Health) -> str | None:
    """Whether a Health message's names agree with the routing id it came from."""
    parsed = parse_route(route)
    if parsed is None:
        return "routing id is not <role>-<index>/<gen>"
    wid, gen = parsed
    if msg.worker != wid or msg.gen != gen:
        return f"the message names {msg.worker:.40}/{msg.gen:x}, its routing id {wid}/{gen:x}"
    if msg.state not in HEALTH_STATES:
        return f"unknown state {msg.state!r:.20}"
    if not _is_int(msg.pid, 1, _MAX_PID):
        return f"bad pid {msg.pid!r:.20}"
    return None


# The facts of a `ready` the frontend uses: name -> check.
_READY_INFO = {
    "role": lambda v: v in ROLES,
    "model": lambda v: _is_text(v, 1024),
    "model_type": lambda v: _is_text(v, 64),
    "random_weights": lambda v: type(v) is bool,
    "zero_cost": lambda v: type(v) is bool,
    "max_model_len": lambda v: _is_int(v, 2, 2**31),
    "vocab_size": lambda v: _is_int(v, 1, 2**31),
    "eos_token_ids": lambda v: (
        isinstance(v, list) and len(v) <= 1024 and all(_is_int(t, 0, 2**31) for t in v)
    ),
    "num_slots": lambda v: _is_int(v, 1, 2**24),
    "num_blocks": lambda v: _is_int(v, 1, 2**40),
    "block_size": lambda v: _is_int(v, 1, 2**20),
    "tokenizer": lambda v: v is None or _is_text(v, 4096),
    "handoff_addr": lambda v: v is None or _is_text(v, 1024),
}


# Facts a `ready` may carry (checked when present).
_READY_OPTIONAL = {
    "max_num_batched_tokens": lambda v: _is_int(v, 1, 2**31),
    "device": lambda v: _is_text(v, 64),
    # The sizes image spans are laid out with, or why the worker takes no images.
    "images": lambda v: (
        _is_text(v, 400)
        or (
            isinstance(v, dict)
            and set(v) == {"patch_size", "downsample_ratio"}
            and all(_is_int(x, 1, 1024) for x in v.values())
        )
    ),
}


def ready_problem(route: bytes, msg: Health) -> str | None:
    """Whether a `ready` is a registration the frontend can trust its facts from."""
    problem = health_problem(route, msg)
    if problem is not None:
        return problem
    info = msg.info
    if len(info) > 64:
        return f"info has {len(info)} entries"
    for name, ok in _READY_INFO.items():
        if name not in info:
            return f"info lacks {name!r}"
        if not ok(info[name]):
            return f"info {name} = {info[name]!r:.40} is out of bounds or of the wrong type"
    for name, ok in _READY_OPTIONAL.items():
        if name in info and not ok(info[name]):
            return f"info {name} = {info[name]!r:.40} is out of bounds or of the wrong type"
    role = info["role"]
    if not msg.worker.startswith(role + "-"):
        return f"worker {msg.worker} announced the role {role!r}"
    if role == "decode":
        addr = info["handoff_addr"]
        try:
            check_address("handoff_addr", addr)
        except ValueError as e:
            return str(e)
        if addr.startswith("inproc://"):
            return "a decode worker's handoff endpoint cannot be inproc://"
    return None


_STATS_COUNTS = (
    "waiting",
    "running",
    "free_slots",
    "num_slots",
    "used_blocks",
    "num_blocks",
    "queued_tokens",
    "steps",
    "generated",
    "preemptions",
    "context_tokens",
)
# A prefill backlog beyond a year is a broken report, not a queue.
_MAX_BACKLOG_S = 365 * 86400.0


def _counter_map(d: dict, what: str) -> str | None:
    if len(d) > _MAX_PREFIX_KEYS:
        return f"{what} has {len(d)} entries"
    for key, value in d.items():
        if not isinstance(key, str) or _COUNTER_NAME.fullmatch(key) is None:
            return f"{what} has a bad name {key!r:.40}"
        if not _is_count(value):
            return f"{what}.{key} = {value!r:.40} is not a count"
    return None


def stats_problem(msg: Stats) -> str | None:
    """Whether a load report holds counts that make sense: non-negative, bounded, consistent."""
    for name in _STATS_COUNTS:
        value = getattr(msg, name)
        if not _is_int(value):
            return f"{name} = {value!r:.40}"
    for name in ("step_seconds", "compute_seconds", "busy_seconds"):
        value = getattr(msg, name)
        if not (math.isfinite(value) and value >= 0):
            return f"{name} = {value!r:.40}"
    for name in ("backlog_s", "lag_s"):
        value = getattr(msg, name)
        if not (math.isfinite(value) and 0 <= value <= _MAX_BACKLOG_S):
            return f"{name} = {value!r:.40}"
    try:
        StepCost.from_wire(msg.step_cost)
    except ValueError as e:
        return f"step_cost: {e}"
    if msg.free_slots > msg.num_slots or msg.running > msg.num_slots:
        return "more free or running slots than slots"
    if msg.used_blocks > msg.num_blocks:
        return "more used blocks than blocks"
    return (
        _counter_map(msg.prefix_cache, "prefix_cache")
        or _counter_map(msg.dropped, "dropped")
        or _expert_parallel_problem(msg.expert_parallel)
    )


_EP_COUNTS = ("group", "rank", "ranks", "slots", "redundant", "group_steps", "rebalances",
              "balance_rows")  # fmt: skip


def _expert_parallel_problem(d: dict) -> str | None:
    """An expert-parallel rank's report: {} or exactly the counts above plus the balance
    factor (max / mean, so >= 1) and the sum of the factors (>= the rows counted)."""
    if not d:
        return None
    if set(d) != {*_EP_COUNTS, "balance_factor", "balance_factor_sum"}:
        return f"expert_parallel has the keys {sorted(d)!r:.80}"
    for name in _EP_COUNTS:
        if not _is_int(d[name]):
            return f"expert_parallel.{name} = {d[name]!r:.40}"
    if not d["ranks"] >= 2 or not 0 <= d["rank"] < d["ranks"]:
        return "expert_parallel: rank outside the group"
    factor, total = d["balance_factor"], d["balance_factor_sum"]
    for name, value in (("balance_factor", factor), ("balance_factor_sum", total)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f"expert_parallel.{name} = {value!r:.40}"
    # (max / mean of N loads lies in [1, N]; the float division may land a rounding outside)
    if not (math.isfinite(factor) and 1 - 1e-9 <= factor <= d["ranks"] * (1 + 1e-9)):
        return f"expert_parallel.balance_factor = {factor!r:.40}"
    rows = d["balance_rows"]
    if not (math.isfinite(total) and rows * (1 - 1e-9) <= total <= rows * d["ranks"] * (1 + 1e-9)):
        return f"expert_parallel.balance_factor_sum = {total!r:.40}"
    return None


def _pairs(items: list, kinds: tuple) -> bool:
    """Every item is a list of len(kinds) whose entries pass the checks in kinds."""
    for item in items:
        if not isinstance(item, list) or len(item) != len(kinds):
            return False
        if not all(ok(v) for ok, v in zip(kinds, item, strict=True)):
            return False
    return True


def _rid(v: Any) -> bool:
    return _is_int(v, 0, _MAX_ID)


def tokens_problem(msg: Tokens, vocab_size: int | None) -> str | None:
    """Whether a Tokens message is internally consistent (ids within the vocabulary)."""
    n = len(msg.rids)
    if len(msg.offsets) != n or len(msg.counts) != n:
        return "rids, offsets and counts differ in length"
    if not all(map(_rid, msg.rids)):
        return "a request id is not an unsigned 64-bit integer"
    if not all(map(_is_int, msg.offsets)) or not all(map(_is_int, msg.counts)):
        return "an offset or count is not a non-negative integer"
    ids = msg.token_ids
    if sum(msg.counts) != len(ids):
        return f"counts add up to {sum(msg.counts)}, but {len(ids)} token ids came"
    if len(ids) and (
        int(ids.min()) < 0 or (vocab_size is not None and int(ids.max()) >= vocab_size)
    ):
        return "a token id is outside the vocabulary"
    if not _pairs(msg.finished, (_rid, lambda v: v in _FINISH_REASONS, _is_int)):
        return "finished entries are not [rid, reason, total]"
    if not _pairs(msg.cache_hits, (_rid, _is_int)):
        return "cache_hits entries are not [rid, tokens]"
    if not _pairs(msg.errors, (_rid, _is_text)):
        return "errors entries are not [rid, message]"
    return _logprobs_problem(msg, vocab_size)


def _logprobs_problem(msg: Tokens, vocab_size: int | None) -> str | None:
    """The log probabilities line up with the tokens (one per token of each entry that has
    them, k alternatives per token) and are log probabilities: finite, in [FLOOR, 0]."""
    ks = msg.logprob_k
    lps, top_ids, top_lps = msg.logprobs, msg.top_ids, msg.top_logprobs
    if not ks:
        if len(lps) or len(top_ids) or len(top_lps):
            return "log probabilities came without logprob_k"
        return None
    if len(ks) != len(msg.rids):
        return "logprob_k differs in length from rids"
    if not all(type(k) is int and -1 <= k <= MAX_TOP_LOGPROBS for k in ks):
        return f"a logprob_k is not in [-1, {MAX_TOP_LOGPROBS}]"
    want = sum(n for n, k in zip(msg.counts, ks, strict=True) if k >= 0)
    want_top = sum(n * k for n, k in zip(msg.counts, ks, strict=True) if k > 0)
    if len(lps) != want or len(top_ids) != want_top or len(top_lps) != want_top:
        return "log probability arrays do not match the counts"
    for arr in (lps, top_lps):
        # NaN fails both comparisons; +-inf fails one.
        if len(arr) and not (float(arr.min()) >= LOGPROB_FLOOR and float(arr.max()) <= 0.0):
            return "a log probability is not a finite value in [-9999, 0]"
    if len(top_ids) and (
        int(top_ids.min()) < 0 or (vocab_size is not None and int(top_ids.max()) >= vocab_size)
    ):
        return "a top log probability token id is outside the vocabulary"
    return None


def constraint_problem(constraint: Constraint | None) -> str | None:
    """Whether the output constraint a Submit or Handoff carries is one a worker may compile:
    its grammar within the size the frontend builds (a worker answers a bad one with an error
    for the request; the codec has already checked its kind and types)."""
    if constraint is None:
        return None
    if len(constraint.grammar) > MAX_GRAMMAR_CHARS:
        return (
            f"its output constraint has {len(constraint.grammar)} characters of grammar "
            f"(limit {MAX_GRAMMAR_CHARS})"
        )
    return None
