"""Shared helpers of the bad request input tests (`test_request_bad_input_*.py`): all three
protocols, deepring_recipe against the official wheel.

Complements `tests/conformance/test_requests_malformed.py`, which already compares both
libraries on malformed bodies (`test_malformed_body`: nesting 126..100000 in an unknown field,
circular references in an unknown field and at the top level, non-dict bodies, bad JSON texts,
invalid UTF-8 in the model name, wrong types of top-level fields) and on huge bodies
(`test_huge_body`: 10 MB content as dict / str / bytes, 20k messages, converted and rendered in
under 20 s). What is added:

- nesting at and past the depth limit inside values conversion keeps and walks (tool parameter
  schemas, strict schemas, a response schema, Messages `tool_use.input`), as a Python body and
  as JSON text, and deep JSON inside tool-call `arguments` strings, which the body limit does
  not cover (`test_request_bad_input_limits.py`);
- circular references inside the request's own fields (messages, content parts, schemas,
  Responses input, Messages tool input) (`test_request_bad_input_circular.py`);
- invalid UTF-8 inside message content of a bytes body, and a lone surrogate in a str content
  (`test_request_bad_input_text.py`);
- wrong types of nested fields, per protocol (`test_request_bad_input_types.py`);
- a 10 MB content rendered *and encoded* with the fixture tokenizer (slow tier;
  `test_request_bad_input_limits.py`).

Where both libraries must agree, the whole pipeline summary of the conformance suite is
compared; on top of that each rejection must be an ordinary exception whose message names the
problem. Python bodies nested too deeply raise `RecursionError` (a `RuntimeError`) in both
libraries, JSON texts a `ValueError`: ours keeps the official's types.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import deepring_recipe as ours
import deepseek_recipe as official

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import summary as S

MODEL = "DeepSeek-V4.1-Flash"
NEST = "__NESTED__"


def both(protocol: str, body: Any, tokenizers: dict | None = None) -> tuple[dict, dict]:
    """(ours, official) pipeline summaries of one body with default options."""
    case = {"protocol": protocol, "body": body, "options": {}}
    tok = tokenizers or {}
    return (
        S.request_summary(ours, case, tok.get(ours)),
        S.request_summary(official, case, tok.get(official)),
    )


def assert_same(actual: dict, expected: dict) -> None:
    if S.canonical_json(actual) != S.canonical_json(expected):
        raise AssertionError(
            f"deepring_recipe differs from deepseek_recipe at "
            f"{S.first_difference(actual, expected)} "
            f"(ours: {S.outcome_label(actual)}, official: {S.outcome_label(expected)})"
        )


def rejection(summary: dict) -> dict | None:
    return summary.get("construct") or summary.get("convert")


def content_body(protocol: str, content: Any) -> dict:
    if protocol == "chat":
        return {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    if protocol == "responses":
        return {"model": MODEL, "input": [{"role": "user", "content": content}]}
    return {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
