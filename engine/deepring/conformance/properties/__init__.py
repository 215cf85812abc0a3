"""The properties a conformance run checks: ones that hold for any correct server, whatever
its model says. Each module checks one concern; every check records into a `Verdicts`.

streams: SSE framing, event order, streamed = non-streamed, the stream accumulates to the body
usage:   usage arithmetic, prompt counts against deepring_recipe, prefix-cache hits
outputs: tool calls, markup leaks, forced tool choice, JSON-schema outputs
errors:  error shapes and statuses, invalid bodies, unknown models, oversize prompts
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# (name, what it checks), in the order of the summary table.
PROPERTIES: list[tuple[str, str]] = [
    ("sse_framing", "streams are well-formed SSE with JSON data and the protocol's terminator"),
    ("event_order", "the protocol's event order, with exactly one terminal event, last"),
    # greedy requests only: thinking mode samples at temperature 1 (oracle.expect)
    ("stream_agrees", "streamed and non-streamed results agree at temperature 0 with a seed"),
    ("stream_accumulates", "the object accumulated from a stream equals the non-streamed body"),
    ("usage_arithmetic", "total = prompt + completion, cached <= prompt, reasoning <= completion"),
    ("prompt_tokens", "the prompt count is what deepring_recipe renders the request to"),
    ("tool_calls", "tool-call ids unique, names declared, arguments a JSON object"),
    ("no_markup", "no DSML or </think> markup in content, reasoning or arguments"),
    ("tool_choice", "tool_choice required / named is honoured"),
    ("response_format", "json_schema outputs parse and validate against the schema"),
    ("error_shape", "errors are a 4xx (never a 5xx) with the protocol's error body"),
    ("invalid_refused", "a body deepring_recipe cannot convert is refused with a 4xx"),
    ("unknown_model", "an unknown model is refused with a 4xx"),
    ("oversize_prompt", "a prompt beyond the context length is refused with a 4xx"),
    ("prefix_cache", "a repeated request reports cached prompt tokens (where claimed)"),
]
NAMES = [name for name, _ in PROPERTIES]


@dataclass
class Verdicts:
    """What one example showed: the properties that applied, and the first failure of each."""

    applied: set[str] = field(default_factory=set)
    failed: dict[str, tuple[str, Any]] = field(default_factory=dict)  # name: (message, request)
    request: Any = None  # the request under check now: a failure names it

    def ok(self, name: str) -> None:
        self.applied.add(name)

    def fail(self, name: str, message: str) -> None:
        self.applied.add(name)
        self.failed.setdefault(name, (message, self.request))

    def merge(self, other: Verdicts) -> None:
        self.applied |= other.applied
        for name, failure in other.failed.items():
            self.failed.setdefault(name, failure)

    def check(self, name: str, message: str | None) -> None:
        """Applied; failed when there is a message."""
        if message:
            self.fail(name, message)
        else:
            self.ok(name)
