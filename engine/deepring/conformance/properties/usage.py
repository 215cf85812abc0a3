"""Usage: its arithmetic, the prompt count against deepring_recipe's rendering, and prefix-cache
hits on a repeated request."""

from __future__ import annotations

from deepring.conformance.outputs import Usage
from deepring.conformance.properties import Verdicts


def check_arithmetic(v: Verdicts, usage: Usage | None, where: str, max_tokens: int | None) -> None:
    """where: which answer it is (for the message); max_tokens: the request's output cap."""
    if usage is None:
        v.fail("usage_arithmetic", f"{where}: no usage")
        return
    u = usage
    problems = []
    counts = {"prompt": u.prompt, "completion": u.completion}
    for name, value in counts.items():
        if value is None or value < 0:
            problems.append(f"{name} tokens {value!r} is no count")
    for name, value in {"total": u.total, "cached": u.cached, "reasoning": u.reasoning}.items():
        if value is not None and value < 0:
            problems.append(f"{name} tokens {value} < 0")
    prompt, completion = u.prompt, u.completion
    if not problems and prompt is not None and completion is not None:
        if u.total is not None and u.total != prompt + completion:
            problems.append(f"total {u.total} != prompt {prompt} + completion {completion}")
        if u.cached is not None and u.cached > prompt:
            problems.append(f"cached {u.cached} > prompt {prompt}")
        if u.reasoning is not None and u.reasoning > completion:
            problems.append(f"reasoning {u.reasoning} > completion {completion}")
        if max_tokens is not None and completion > max_tokens:
            problems.append(f"completion {completion} > max tokens {max_tokens}")
    v.check("usage_arithmetic", f"{where}: {'; '.join(problems)} in {u.raw}" if problems else None)


def check_prompt_count(
    v: Verdicts, usage: Usage | None, expected: set[int] | None, where: str
) -> None:
    """expected: the counts deepring_recipe renders the request to (None: not known)."""
    if expected is None or usage is None or usage.prompt is None:
        return
    message = None
    if usage.prompt not in expected:
        message = (
            f"{where}: prompt tokens {usage.prompt}, deepring_recipe renders {sorted(expected)}"
        )
    v.check("prompt_tokens", message)


def check_cache_hit(v: Verdicts, first: Usage | None, second: Usage | None, claimed: bool) -> None:
    """The second of two identical requests, sent one after the other. claimed: the server says
    it caches prefixes (--prefix-cache on), or it reports a cached count at all (auto)."""
    if first is None or second is None:
        return
    reports = first.cached is not None or second.cached is not None
    if not (claimed or reports):
        return
    cached = second.cached or 0
    message = None
    if cached <= 0:
        message = (
            f"a repeated {second.prompt}-token prompt reports {second.cached!r} cached tokens "
            f"(first request: {first.cached!r})"
        )
    v.check("prefix_cache", message)
