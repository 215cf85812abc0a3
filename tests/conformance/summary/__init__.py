"""Pipeline helpers shared by the conformance tests and `selfcheck.py`.

Everything here takes the library module `M` as an argument (`deepring_recipe` or
`deepseek_recipe`) and reduces what `M` does to plain Python data (str, int, float, bool,
None, list, dict), so that the result of one module can be compared with the other's with
`==` and, type-strictly, through `canonical_json`.

Requests (issue 3): `request_summary(M, case, tokenizer)` runs
`<Proto>Request(body)` -> (Responses extras) -> `convert(options)` -> conversation,
inference and parsing options -> `resolve_max_tokens` -> V4 and V4.1 rendering and encoding.

Streams (issue 5): `run_stream(M, case, chunking, tokenizer)` converts the case's request,
pushes the chunking through `StreamProcessor` and reduces the events (see `reduce_events`).

Intentional deviations of deepring_recipe from the official library (recipe/DEVIATIONS.md)
are handled in exactly one place, `adjust_for_deviations`.

Modules: `common` (protocol class names, exceptions as data, the type-strict comparison),
`options` (ConversionOptions from a spec), `conversion` (conversation, inference and parsing
options as data), `requests` (the request pipeline), `deviations`, `streams` (running and
reducing a stream), `merge` (merging consecutive deltas), `invariance` (comparing the runs of
one output under several chunkings). The names the tests use are re-exported here.
"""

from .common import (
    PROTOCOLS,
    REQUEST_CLASS,
    RESPONSE_CLASS,
    attempt,
    canonical_json,
    first_difference,
)
from .conversion import parsing_summary
from .deviations import (
    adjust_for_deviations,
    check_deviation_expectations,
    has_max_completion_tokens,
    reasoning_capped,
    strict_defs_deviation,
    verbosity_as_ours,
)
from .invariance import (
    ByteTokens,
    collapse_spaces,
    invariance_problems,
    strip_logprobs,
    strip_usage,
)
from .merge import merge_deltas
from .options import build_options, special_token_overrides, special_tokens
from .requests import outcome_label, request_summary
from .streams import Normaliser, build_chunks, reduce_events, run_stream

__all__ = [
    "PROTOCOLS",
    "REQUEST_CLASS",
    "RESPONSE_CLASS",
    "ByteTokens",
    "Normaliser",
    "adjust_for_deviations",
    "attempt",
    "build_chunks",
    "build_options",
    "canonical_json",
    "check_deviation_expectations",
    "collapse_spaces",
    "first_difference",
    "has_max_completion_tokens",
    "invariance_problems",
    "merge_deltas",
    "outcome_label",
    "parsing_summary",
    "reasoning_capped",
    "reduce_events",
    "request_summary",
    "run_stream",
    "special_token_overrides",
    "special_tokens",
    "strict_defs_deviation",
    "strip_logprobs",
    "strip_usage",
    "verbosity_as_ours",
]
