"""The output constraint a request carries from the frontend to the workers.

A constraint is a grammar in llguidance's Lark dialect (JSON Schemas inline as `%json {...}`,
special tokens by id as `<[128822]>`), built and validated once by the frontend
(`structured.build`), so a worker only compiles it. It travels in `Submit` and `Handoff` as a
typed map (`to_wire` / `from_wire`), and its size is checked on arrival
(`ipc.validate.constraint_problem`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What the constraint came from (for logs and metrics; the grammar alone decides the output).
KINDS = ("json", "regex", "tool_call", "tool_call_required", "grammar")

# The largest grammar the frontend builds or a worker takes (characters). llguidance handles
# schemas of a few MB; a request body is bounded well below this by the HTTP limits anyway.
MAX_GRAMMAR_CHARS = 4 << 20


@dataclass(frozen=True)
class Constraint:
    """kind: one of KINDS. grammar: the llguidance Lark grammar the output must match in full,
    followed by EOS."""

    kind: str
    grammar: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind must be one of {KINDS}, got {self.kind!r:.40}")
        if not isinstance(self.grammar, str) or not self.grammar:
            raise ValueError("a constraint needs a grammar")
        # Its size is bounded where one is built (structured.build) and where one arrives
        # (ipc.validate.constraint_problem, so a worker answers with an error, not a drop).

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "grammar": self.grammar}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Constraint:
        """The inverse of to_wire; ValueError for unknown, missing or bad fields."""
        if set(d) != {"kind", "grammar"}:
            raise ValueError(f"constraint fields must be kind and grammar, got {sorted(d)!r:.80}")
        if not isinstance(d["kind"], str) or not isinstance(d["grammar"], str):
            raise ValueError("constraint kind and grammar must be strings")
        return cls(d["kind"], d["grammar"])
