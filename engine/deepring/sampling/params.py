"""Per-request sampling parameters."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# Integers off the wire must fit the int32 / int64 tensors the sampler builds from them, and
# floats must be finite: a peer's value out of range is refused here, not in a kernel.
_I32 = 2**31


def _int32(v: Any) -> bool:
    return _is_int(v) and -_I32 <= v < _I32


def _finite(v: Any) -> bool:
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


_WIRE_TYPES = {
    "temperature": _finite,
    "top_p": _finite,
    "top_k": _int32,
    "min_p": _finite,
    "presence_penalty": _finite,
    "frequency_penalty": _finite,
    "seed": lambda v: v is None or _is_int(v),
    "max_tokens": _int32,
    "stop_token_ids": lambda v: isinstance(v, tuple) and len(v) <= 4096 and all(map(_int32, v)),
    "ignore_eos": lambda v: isinstance(v, bool),
    "logprobs": lambda v: v is None or _int32(v),
    "thinking_budget": lambda v: v is None or _int32(v),
    "think_end_id": lambda v: v is None or _int32(v),
}
_FLOATS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty")

# OpenAI's bounds: penalties in [-2, 2], at most 20 alternatives per token.
MAX_PENALTY = 2.0
MAX_TOP_LOGPROBS = 20
# OpenAI reports tokens the distribution excludes (log probability -inf) as -9999.0: finite, so
# the value survives JSON. Reported log probabilities lie in [LOGPROB_FLOOR, 0].
LOGPROB_FLOOR = -9999.0

# One sampled token's log probability and its top alternatives, most likely first:
# (logprob, [(token id, logprob), ...]); the shape deepring_recipe's InferenceChunk.tokens takes.
TokenLogprob = tuple[float, list[tuple[int, float]]]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.

    temperature: 0 means greedy. top_k <= 0, top_p == 1 and min_p == 0 disable those filters
    (min_p keeps the tokens at least min_p times as likely as the most likely one). seed makes a
    request's randomness reproducible: the uniform for the token at position p is a hash of
    (seed, p), so the output does not depend on the batch the request shares.
    presence_penalty / frequency_penalty (OpenAI's, in [-2, 2]) lower the logit of every token
    the request's output holds so far, by presence_penalty once and frequency_penalty per
    occurrence, before temperature. logprobs: None for none, else k in [0, 20]: each token's log
    probability and the k most likely alternatives (see sampling.sampler for the distribution).
    Generation stops at max_tokens, at an EOS token (unless ignore_eos) or at any of
    stop_token_ids (the stop token is kept in the output).
    thinking_budget: for an output that starts in thinking mode, at most this many tokens of
    reasoning: once the output holds thinking_budget tokens and no think_end_id (`</think>`), the
    next token is think_end_id (the sampler is given nothing else; its log probability is 0),
    and the answer follows. None: the reasoning is bounded by max_tokens only.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    thinking_budget: int | None = None
    think_end_id: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not (0 <= self.seed < 2**64):
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        ids = tuple(self.stop_token_ids)
        if any(not isinstance(t, int) or t < 0 for t in ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {ids!r}")
        object.__setattr__(self, "stop_token_ids", ids)
        lp = self.logprobs
        if lp is not None and (
            not isinstance(lp, int) or isinstance(lp, bool) or not 0 <= lp <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(f"logprobs must be None or in [0, {MAX_TOP_LOGPROBS}], got {lp!r}")
        budget, end = self.thinking_budget, self.think_end_id
        if budget is not None:
            if not _is_int(budget) or budget < 0:
                raise ValueError(f"thinking_budget must be None or >= 0, got {budget!r}")
            if not _is_int(end) or end < 0:
                raise ValueError(f"a thinking_budget needs think_end_id (a token id), got {end!r}")

    def forced_think_end(self, output_ids_len: int, thinking_ended: bool) -> int | None:
        """The token the budget forces next (None: nothing is forced)."""
        if self.thinking_budget is None or thinking_ended:
            return None
        return self.think_end_id if output_ids_len >= self.thinking_budget else None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def argmax_only(self) -> bool:
        """Greedy, and nothing but the argmax of the model's logits is needed: no penalty moves
        it and no log probability is reported (the model's greedy head may then skip the full
        logits)."""
        return self.temperature == 0 and not self.penalized and self.logprobs is None

    def to_wire(self) -> dict[str, Any]:
        """The fields as a msgpack-able map (how Submit and Handoff carry them)."""
        d = asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> SamplingParams:
        """The inverse of to_wire; ValueError for unknown, missing or bad fields."""
        names = {f.name for f in fields(cls)}
        unknown = {k for k in d if k not in names}
        if unknown:
            raise ValueError(f"unknown sampling fields {sorted(map(repr, unknown))}"[:200])
        d = dict(d)
        if isinstance(d.get("stop_token_ids"), list):
            d["stop_token_ids"] = tuple(d["stop_token_ids"])
        for name, value in d.items():
            if not _WIRE_TYPES[name](value):
                raise ValueError(f"bad sampling parameter {name}={value!r:.40}")
        for name in _FLOATS:  # msgpack keeps 1.0 a float; a sender may send 1
            if name in d:
                d[name] = float(d[name])
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(f"bad sampling parameters: {e}") from None
