"""Grammars for the output constraints, in llguidance's Lark dialect, and their validation.

A grammar's `answer` rule is what the output must be; `wrap` puts it after the reasoning when the
output starts in thinking mode (`start: REASONING </think> answer`: the constraint applies after
`</think>`, the reasoning is free text, and the model cannot end before answering). Every grammar
ends the output with EOS once it is complete (llguidance allows only EOS then), so a
grammar-terminated output finishes with the reason `stop`.

JSON is written compactly with Python's separators (`{"a": 1, "b": [2, 3]}`, the style of the
prompt's schemas and of DSML values): no whitespace before, between or after values beyond
those. A random model therefore cannot pad an answer with whitespace forever.

Torch-free: the frontend validates here (a grammar llguidance cannot compile is a 400 naming the
problem, before any worker sees it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import llguidance

# llguidance's JSON compile options for every %json: compact, Python-style separators.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# Free text of any length (reasoning, a tool_choice=auto answer): any characters, no special
# tokens (a regex never matches one), so only the grammar's own special tokens can appear.
FREE_TEXT = "/(?s:.*)/"


@dataclass(frozen=True)
class Markers:
    """The special tokens a grammar names by id, from the served tokenizer. think_end:
    `</think>`; dsml: `｜DSML｜` (None when the tokenizer lacks it). v41: the DSML tags are V4.1's
    (` calls`, ` invoke`, ` parameter`) instead of V4's (`tool_calls`, `invoke`, `parameter`)."""

    think_end: int | None
    dsml: int | None
    v41: bool = False


class GrammarError(ValueError):
    """A constraint that cannot be turned into a grammar llguidance compiles (the message says
    why; the frontend answers 400 with it)."""


def special(token_id: int | None, what: str) -> str:
    """A special token in a grammar rule: `<[id]>`."""
    if token_id is None:
        raise GrammarError(f"the served tokenizer has no {what} token")
    return f"<[{int(token_id)}]>"


def json_value(schema: Any, *, lenient: bool = False) -> str:
    """`%json {...}`: a JSON value of `schema` (None: any JSON object). lenient: keywords
    llguidance does not implement are ignored instead of refused."""
    if schema is None:
        schema = {"type": "object"}
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON Schema is an object or true, got {json.dumps(schema)[:80]}")
    body = {k: v for k, v in schema.items() if k != "x-guidance"}
    # Our style, and never options from the request (a client must not turn lenient on).
    body["x-guidance"] = {**JSON_STYLE, "lenient": lenient}
    return "%json " + json.dumps(body, ensure_ascii=False)


def regex_terminal(regex: str, use_ascii: str = "") -> str:
    """`/.../` matching exactly `regex` (Rust regex syntax, as Python's for the common subset).
    use_ascii="dw": \\d and \\w as JSON Schema (ECMA 262) reads them."""
    return "/" + llguidance.regex_to_lark(regex, use_ascii) + "/"


def wrap(answer_rules: list[str], reasoning: bool, markers: Markers) -> str:
    """A whole grammar whose rule `answer` (defined in answer_rules) is the output; with
    reasoning, the output is free reasoning, `</think>`, then the answer."""
    if reasoning:
        head = [f"start: REASONING {special(markers.think_end, '</think>')} answer"]
        head.append(f"REASONING: {FREE_TEXT}")
    else:
        head = ["start: answer"]
    return "\n".join(["%llguidance {}", *head, *answer_rules]) + "\n"


def json_grammar(schema: Any, reasoning: bool, markers: Markers) -> str:
    return wrap([f"answer: {json_value(schema)}"], reasoning, markers)


def regex_grammar(regex: str, reasoning: bool, markers: Markers) -> str:
    """\\d and \\w are ASCII, as in JSON Schema patterns (a Unicode \\d depends on the Unicode
    version of the regex engine: Rust's and Python's disagree on new digits)."""
    return wrap([f"answer: {regex_terminal(regex, 'dw')}"], reasoning, markers)


@lru_cache(maxsize=512)
def validate(grammar: str) -> str | None:
    """None when llguidance compiles `grammar`, else its message (cached per grammar: clients
    repeat their schemas). Bounded in time by llguidance's default limits (lexer fuel, grammar
    size, Earley items), which make a pathological grammar an error, not a hang."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return (messages[0] if messages else "invalid grammar") if is_error else None


def check(grammar: str) -> str:
    """`grammar`, or GrammarError with llguidance's message."""
    problem = validate(grammar)
    if problem is not None:
        raise GrammarError(problem.strip())
    return grammar
