"""A request's sampling parameters: what deepring_recipe resolves, plus the body fields it does
not expose.

The recipe's InferenceOptions give max_tokens, temperature, top_p, seed (Chat), logprobs and
top_logprobs; it checks and then drops presence_penalty / frequency_penalty (Chat) and ignores
the rest. Those fields are read from the body with the rest of its outline (protocol.fields,
`deepring_recipe.request_outline`: one scan that builds nothing but the named fields, so an
8 MB body is not parsed twice), and each one is either honoured or refused with a 400 that
names it: none is dropped silently.
docs/configuration.md lists what each API honours.
"""

from __future__ import annotations

import math
from typing import Any

from deepring_recipe import InferenceOptions

from deepring.protocol.errors import ApiError, field_error
from deepring.sampling.params import MAX_PENALTY

# Honoured on every API (vLLM's extensions, and Anthropic's own top_k).
_COMMON = ("top_k", "min_p", "stop_token_ids", "ignore_eos", "presence_penalty",
           "frequency_penalty")  # fmt: skip
# Read to be refused unless neutral: an API's or vLLM's field that is not implemented.
_REFUSED = ("repetition_penalty", "min_tokens", "logit_bias")
FIELDS = {
    "chat.completions": (*_COMMON, *_REFUSED),
    # Responses has no seed, and includes logprobs with include: [...] (OpenAI's form).
    "responses": (*_COMMON, *_REFUSED, "seed", "include"),
    "messages": (*_COMMON, *_REFUSED, "seed", "logprobs", "top_logprobs"),
}
_INCLUDE_LOGPROBS = "message.output_text.logprobs"
_I32 = 2**31
_SEED_LIMIT = 2**63  # the recipe's bound on Chat's seed


def _bad(name: str, message: str) -> ApiError:
    """A 400 naming the field (OpenAI's `param` carries it too)."""
    return field_error(name, message)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(name: str, v: Any, lo: float, hi: float) -> float:
    ok = (_is_int(v) or isinstance(v, float)) and math.isfinite(v) and lo <= v <= hi
    if not ok:
        raise _bad(name, f"Invalid {name} value, the valid range of {name} is [{lo:g}, {hi:g}]")
    return float(v)


def _top_k(v: Any) -> int:
    if not _is_int(v) or not -1 <= v < _I32:
        raise _bad("top_k", "Invalid top_k value: -1 or 0 (off) or a positive integer")
    return v if v > 0 else -1


def _stop_token_ids(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > 4096 or not all(_is_int(t) and 0 <= t < _I32 for t in v):
        raise _bad(
            "stop_token_ids",
            "Invalid stop_token_ids value: a list of at most 4096 token ids (integers >= 0)",
        )
    return tuple(v)


def _refuse_unless_neutral(name: str, v: Any) -> None:
    neutral = {"repetition_penalty": (1, 1.0), "min_tokens": (0,), "logit_bias": ({},)}[name]
    if v is not None and not (v in neutral and not isinstance(v, bool)):
        what = {
            "repetition_penalty": "repetition_penalty is not supported (only 1.0); "
            "presence_penalty and frequency_penalty are",
            "min_tokens": "min_tokens is not supported (only 0)",
            "logit_bias": "logit_bias is not supported (only an empty map)",
        }[name]
        raise _bad(name, what)


def sampling_fields(api: str, got: dict[str, Any], io: InferenceOptions) -> dict[str, Any]:
    """SamplingParams keyword arguments for the request's fields beyond temperature, top_p and
    max_tokens (which the caller resolves): top_k, min_p, penalties, stop_token_ids, ignore_eos,
    logprobs, and seed where the recipe does not read it. `got`: the body's fields FIELDS[api]
    that are present (protocol.fields reads them with the rest of the body's outline).
    ApiError (400) naming a field that is malformed or asks for what is not served."""
    names = FIELDS[api]
    out: dict[str, Any] = {}
    for name, v in got.items():  # in the body's order: the first bad field is named
        if name not in names:
            continue
        if v is None:
            continue  # JSON null: the default, as for the fields the recipe reads
        if name == "top_k":
            out["top_k"] = _top_k(v)
        elif name == "min_p":
            out["min_p"] = _number(name, v, 0.0, 1.0)
        elif name in ("presence_penalty", "frequency_penalty"):
            out[name] = _number(name, v, -MAX_PENALTY, MAX_PENALTY)
        elif name == "stop_token_ids":
            out["stop_token_ids"] = _stop_token_ids(v)
        elif name == "ignore_eos":
            if not isinstance(v, bool):
                raise _bad(name, "Invalid ignore_eos value: true or false")
            out["ignore_eos"] = v
        elif name == "seed":
            if not _is_int(v) or not 0 <= v < _SEED_LIMIT:
                raise _bad(name, "Invalid seed value, the valid range of seed is [0, 2^63)")
            out["seed"] = v
        elif name in ("logprobs", "top_logprobs"):  # Messages
            if v is not False:
                raise _bad(
                    name,
                    f"{name}: the Messages API has no log probabilities (Chat Completions and "
                    "Responses have)",
                )
        elif name == "include":
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise _bad(name, "Invalid include value: a list of strings")
        else:
            _refuse_unless_neutral(name, v)
    logprobs = _logprobs(api, io, got.get("include"))
    if logprobs is not None:
        out["logprobs"] = logprobs
    return out


def _logprobs(api: str, io: InferenceOptions, include: Any) -> int | None:
    """The number of alternatives per token to report, or None for no log probabilities.
    Chat: logprobs (with top_logprobs alternatives). Responses: top_logprobs given (the recipe
    sets logprobs then) or include naming message.output_text.logprobs."""
    asked = io.logprobs
    if api == "responses" and isinstance(include, list) and _INCLUDE_LOGPROBS in include:
        asked = True
    if not asked:
        return None
    return int(io.top_logprobs or 0)
