"""Refusals: an error answer is a 4xx with the protocol's error body; what must be refused is.

OpenAI:    {"error": {"message": str, "type": str, ...}}
Anthropic: {"type": "error", "error": {"type": str, "message": str}}
"""

from __future__ import annotations

from deepring.conformance.properties import Verdicts
from deepring.conformance.wire import Exchange


def error_shape_problem(ex: Exchange) -> str | None:
    """What is wrong with an error answer (None when it is a 4xx with the right body)."""
    if ex.error is not None:
        return f"no answer: {ex.error}"
    if not 400 <= ex.status < 500:
        return f"HTTP {ex.status}: {ex.raw[:200]!r}"
    body = ex.json
    err = body.get("error") if isinstance(body, dict) else None
    if ex.protocol == "messages":
        ok = (
            (
                body.get("type") == "error"
                and isinstance(err, dict)
                and isinstance(err.get("type"), str)
                and isinstance(err.get("message"), str)
            )
            if isinstance(body, dict)
            else False
        )
        shape = '{"type": "error", "error": {"type", "message"}}'
    else:
        ok = isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err
        shape = '{"error": {"message", "type"}}'
    if not ok:
        return f"HTTP {ex.status} with a body that is not {shape}: {ex.raw[:200]!r}"
    return None


def check_error(v: Verdicts, ex: Exchange, where: str) -> None:
    """Any answer that is not a success must be a well-formed 4xx."""
    if ex.ok:
        return
    problem = error_shape_problem(ex)
    v.check("error_shape", f"{where}: {problem}" if problem else None)


def check_refused(v: Verdicts, name: str, ex: Exchange, what: str) -> None:
    """`name` (invalid_refused, unknown_model, oversize_prompt): the request must be refused."""
    if ex.ok:
        v.fail(name, f"{what} was answered HTTP {ex.status}")
        return
    problem = error_shape_problem(ex)
    v.check(name, f"{what}: {problem}" if problem else None)
