"""What the model's answer may contain, whatever the model: tool calls that are well formed,
no template markup, the tool choice and the JSON schema the request forced."""

from __future__ import annotations

import json
from typing import Any

from deepring.conformance.outputs import Output
from deepring.conformance.properties import Verdicts

# The template's markup: the DSML marker of tool-call blocks (V4 and V4.1 spell it with the
# fullwidth bar) and the end of reasoning. A server that parses the model's output must never
# pass them on as text.
MARKUP = ("｜DSML｜", "</think>")

OPENER = "<｜DSML｜"  # how a tool-call block starts, V4 and V4.1

# A finish that says the output was cut short: what it holds may be a prefix of a valid one.
TRUNCATED = frozenset({"length", "max_tokens", "incomplete:max_output_tokens"})


def check_tool_calls(v: Verdicts, out: Output, declared: set[str], where: str) -> None:
    if not out.tool_calls:
        return
    problems = []
    ids = [c.id for c in out.tool_calls]
    if any(not isinstance(i, str) or not i for i in ids):
        problems.append(f"a tool call without an id: {ids}")
    elif len(set(ids)) != len(ids):
        problems.append(f"tool-call ids repeat: {ids}")
    truncated = out.finish in TRUNCATED
    for i, c in enumerate(out.tool_calls):
        if c.name not in declared:
            problems.append(f"call {i} names {c.name!r}, which the request does not declare")
        last = i == len(out.tool_calls) - 1
        if truncated and last:
            continue  # the output stopped inside this call's arguments
        try:
            args = json.loads(c.arguments)
        except (ValueError, TypeError):
            problems.append(f"call {i} ({c.name}) arguments are not JSON: {c.arguments!r}")
            continue
        if not isinstance(args, dict):
            problems.append(f"call {i} ({c.name}) arguments are not an object: {c.arguments!r}")
    v.check("tool_calls", f"{where}: {'; '.join(problems)}"[:600] if problems else None)


def check_markup(v: Verdicts, out: Output, where: str) -> None:
    fields = {"content": out.content, "reasoning": out.reasoning}
    for i, c in enumerate(out.tool_calls):
        fields[f"call {i} arguments"] = c.arguments or ""
        fields[f"call {i} name"] = c.name or ""
    for name, text in fields.items():
        for marker in MARKUP:
            if marker in text:
                at = text.index(marker)
                v.fail(
                    "no_markup",
                    f"{where}: {marker!r} in {name}: {text[max(0, at - 40) : at + 60]!r}",
                )
                return
    v.ok("no_markup")


def check_tool_choice(v: Verdicts, out: Output, forced: tuple | None, where: str) -> None:
    """forced: ("required", None) or ("named", name) from the request."""
    if forced is None:
        return
    problems = []
    text = out.content.strip()
    # Cut off by max tokens right after the "<" of the forced "<｜DSML｜..." block opener, the
    # "<" is text: nothing has made it markup yet (the recipe flushes a held partial so).
    cut_opener = out.finish in TRUNCATED and text and OPENER.startswith(text)
    if text and not cut_opener:
        problems.append(f"text content {out.content[:80]!r} where a tool call is forced")
    if not out.tool_calls and out.finish not in TRUNCATED:
        problems.append(f"no tool call, finish {out.finish!r}")
    if forced[0] == "named":
        names = [c.name for c in out.tool_calls]
        if any(n != forced[1] for n in names):
            problems.append(f"calls {names} where {forced[1]!r} is forced")
    v.check("tool_choice", f"{where}: {'; '.join(problems)}" if problems else None)


def check_schema(v: Verdicts, out: Output, schema: Any, where: str) -> None:
    """A complete output (not cut by max tokens) must be JSON valid against the schema."""
    if schema is None or out.finish in TRUNCATED or out.tool_calls:
        return
    try:
        import jsonschema
    except ImportError:
        return  # the runner reports the property as skipped, saying why
    try:
        value = json.loads(out.content)
    except ValueError:
        v.fail("response_format", f"{where}: the output is not JSON: {out.content[:200]!r}")
        return
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls(schema).validate(value)
    except jsonschema.SchemaError:
        return  # the server accepted a schema the validator cannot read: nothing to compare
    except jsonschema.ValidationError as e:
        v.fail("response_format", f"{where}: {e.message} in {out.content[:200]!r}")
        return
    v.ok("response_format")
