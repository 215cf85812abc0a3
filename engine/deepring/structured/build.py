"""Constraints from what the recipe resolved, and the offline constructors.

`for_request` reads a converted request's `OutputConstraint` (kind json / regex / tool_call /
tool_call_required) and its parsing options (does the output start in reasoning? in the tool
block?) and returns the validated `Constraint`, or None when the request has none. What is
enforced, per kind:
- json: the answer is one JSON value of the schema (json_schema, strict or not; the recipe has
  already normalised a strict one) or any JSON object (json_object), then EOS;
- regex: the answer matches the regex in full, then EOS;
- tool_call_required (tool_choice required or a named function): one or more well-formed DSML
  invokes of the declared tools with schema-valid parameters, the block's end, then EOS;
- tool_call (tool_choice auto): any text, or text then one such block (strict tools exact,
  others lenient: see structured.tools).
In thinking mode all of it applies after `</think>` (tool blocks may also open inside the
reasoning, as the parser allows). A prefix continuation (the last message is an assistant
prefix) is not constrained: its output continues text the grammar never saw.
"""

from __future__ import annotations

import json
from typing import Any

from deepring.structured.constraint import MAX_GRAMMAR_CHARS, Constraint
from deepring.structured.grammar import (
    GrammarError,
    Markers,
    check,
    json_grammar,
    regex_grammar,
)
from deepring.structured.tools import tool_call_grammar


def _checked(kind: str, grammar: str) -> Constraint:
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(
            f"the output constraint is too large ({len(grammar)} characters of grammar, limit "
            f"{MAX_GRAMMAR_CHARS})"
        )
    return Constraint(kind, check(grammar))


def json_schema(
    schema: Any = None, *, reasoning: bool = False, markers: Markers | None = None
) -> Constraint:
    """Output one JSON value of `schema` (a dict, or a JSON string; None: any JSON object)."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema) if schema else None
        except ValueError as e:
            raise GrammarError(f"the JSON schema is not JSON: {e}") from None
    return _checked("json", json_grammar(schema, reasoning, markers or Markers(None, None)))


def regex(pattern: str, *, reasoning: bool = False, markers: Markers | None = None) -> Constraint:
    """Output text matching `pattern` in full."""
    return _checked("regex", regex_grammar(pattern, reasoning, markers or Markers(None, None)))


def lark(grammar: str) -> Constraint:
    """Output matching a whole llguidance Lark grammar (`start` rule; special tokens as
    `<[id]>`). Offline only: no protocol carries a grammar."""
    return _checked("grammar", grammar)


def tool_calls(
    tools: list[dict],
    *,
    required: bool,
    reasoning: bool,
    markers: Markers,
    single: bool = False,
    must_call: bool = False,
) -> Constraint:
    """Output calling `tools` (Chat Completions function tools) as structured.tools says."""
    kind = "tool_call_required" if required or must_call else "tool_call"
    grammar = tool_call_grammar(
        tools,
        required=required,
        reasoning=reasoning,
        markers=markers,
        single=single,
        must_call=must_call,
    )
    return _checked(kind, grammar)


def _only(tools: list[dict], names: frozenset[str]) -> list[dict]:
    declared = {(t.get("function") or {}).get("name") for t in tools}
    unknown = sorted(names - declared)
    if unknown:
        raise UnknownTool(
            f"tool_choice allowed_tools names {unknown[0]!r}, which is not among the request's "
            "tools"
        )
    return [t for t in tools if (t.get("function") or {}).get("name") in names]


def is_prefix_continuation(conv: Any) -> bool:
    """Whether the request continues an assistant prefix (its output is not constrained)."""
    messages = conv.conversation.messages
    return bool(messages) and messages[-1].role == "assistant" and bool(messages[-1].prefix)


class UnknownTool(GrammarError):
    """tool_choice allowed_tools names a tool the request does not declare."""


def for_request(
    conv: Any,
    markers: Markers,
    *,
    single_call: bool = False,
    must_call: bool = False,
    output_schema: Any = None,
    allowed_tools: frozenset[str] | None = None,
) -> Constraint | None:
    """The constraint of a converted request (deepring_recipe.ConversationRequest), None when
    it has none. GrammarError when it cannot be enforced. What serving adds to the recipe's
    constraint (protocol.fields): single_call (at most one tool call per block), must_call (the
    output calls a tool: Messages tool_choice any), output_schema (a JSON Schema the answer must
    match, for a request the recipe gives none: Messages output_format), allowed_tools (the
    only tools it may call; the prompt shows them all: tool_choice allowed_tools)."""
    oc = conv.inference_options.output_constraint
    options = conv.parsing_options
    stage = options.thinking_initial_stage
    reasoning = stage is not None and stage.starts_in_reasoning()
    if oc is None:
        if output_schema is not None:
            return json_schema(output_schema, reasoning=reasoning, markers=markers)
        return None
    if is_prefix_continuation(conv):
        return None
    if oc.kind == "json":
        return json_schema(oc.schema or None, reasoning=reasoning, markers=markers)
    if oc.kind == "regex":
        return regex(oc.schema, reasoning=reasoning, markers=markers)
    if oc.kind in ("tool_call", "tool_call_required"):
        try:
            tools = json.loads(oc.schema)
        except ValueError as e:
            raise GrammarError(f"the tool list is not JSON: {e}") from None
        if allowed_tools is not None:
            tools = _only(tools, allowed_tools)
        required = bool(options.starts_in_tool_calls)
        return tool_calls(
            tools,
            required=required,
            reasoning=reasoning,
            markers=markers,
            single=single_call,
            must_call=must_call and not required,
        )
    raise GrammarError(f"unknown output constraint kind {oc.kind!r}")
