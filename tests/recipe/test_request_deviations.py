"""The documented request-conversion deviations from deepseek-recipe 0.2.0
(recipe/DEVIATIONS.md, section "Request conversion"), checked against the official wheel.

R1. Chat `max_completion_tokens` is honoured. The oracle: `max_completion_tokens: X` in ours
    must behave exactly like `max_tokens: X` in the official (inference options,
    `resolve_max_tokens`, bounds errors with the same text, prompt and ids), while the official
    itself ignores `max_completion_tokens` (same result as without it). When both are given,
    `max_completion_tokens` wins.
R2. Strict normalisation keeps the `$defs` / `definitions` entries a kept `$ref` points to
    (transitively), normalised; the official drops them. Everything else, the prompt around the
    tool's schema line included, is the official's; a strict schema without references is
    byte-identical to the official.
R4. With several unanswered Responses function calls, ours names the first in call order; the
    official names a random one of them (a hash set), checked here to be one of them.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import deepring_recipe as ours
import deepseek_recipe as official
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import summary as S

MODEL = "DeepSeek-V4.1-Flash"


@pytest.fixture(scope="module")
def tokenizers(v41_tokenizer_path):
    path = str(v41_tokenizer_path)
    return {
        ours: ours.Tokenizer.from_file(path),
        official: official.Tokenizer.from_file(path),
    }


def summary(M: Any, protocol: str, body: dict, tokenizers: dict, options: dict | None = None):
    """The whole pipeline of the conformance suite (construct, convert, resolve_max_tokens,
    V4 and V4.1 prompts with special ranges and ids) reduced to data."""
    case = {"protocol": protocol, "body": body, "options": options or {}}
    return S.request_summary(M, case, tokenizers[M])


def assert_same(actual: Any, expected: Any, what: str) -> None:
    if S.canonical_json(actual) != S.canonical_json(expected):
        outcomes = ""
        if isinstance(actual, dict) and "options" in actual:
            outcomes = f" ({S.outcome_label(actual)} / {S.outcome_label(expected)})"
        raise AssertionError(f"{what}: differs at {S.first_difference(actual, expected)}{outcomes}")


# ---------------------------------------------------------------------------------------------
# R1. max_completion_tokens


def chat_body(thinking: bool, **extra: Any) -> dict:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to three."}],
        "thinking": {"type": "enabled" if thinking else "disabled"},
    }
    body.update(extra)
    return body


# (thinking, value, options spec): in range, at the bounds, and outside them (bounds error).
R1_CASES = [
    (thinking, value, None)
    for thinking in (True, False)
    for value in (1, 100, 8192, 393_216, 0, 393_217, 1_000_000)
] + [
    (False, 1000, {"ctor": {"non_thinking_max_tokens_upper_bound": 1000}}),
    (False, 1001, {"ctor": {"non_thinking_max_tokens_upper_bound": 1000}}),
    (True, 2000, {"ctor": {"thinking_max_tokens_upper_bound": 2000}}),
    (True, 2001, {"ctor": {"thinking_max_tokens_upper_bound": 2000}}),
]


@pytest.mark.parametrize(
    ("thinking", "value", "options"),
    R1_CASES,
    ids=[f"thinking={t}-{v}-{'bound' if o else 'default'}" for t, v, o in R1_CASES],
)
def test_max_completion_tokens_is_honoured(thinking, value, options, tokenizers):
    with_mct = chat_body(thinking, max_completion_tokens=value)
    with_mt = chat_body(thinking, max_tokens=value)
    without = chat_body(thinking)

    ours_mct = summary(ours, "chat", with_mct, tokenizers, options)
    # ours reads max_completion_tokens exactly as the official reads max_tokens: the value,
    # resolve_max_tokens, the bounds check and its error text, the prompt and the ids
    assert_same(
        ours_mct,
        summary(official, "chat", with_mt, tokenizers, options),
        "ours with max_completion_tokens vs official with max_tokens",
    )
    if "convert" not in ours_mct:
        assert ours_mct["inference"]["max_tokens"] == value

    # the official ignores max_completion_tokens altogether
    official_mct = summary(official, "chat", with_mct, tokenizers, options)
    assert_same(
        official_mct,
        summary(official, "chat", without, tokenizers, options),
        "official with max_completion_tokens vs without it",
    )
    assert "convert" not in official_mct
    assert official_mct["inference"]["max_tokens"] is None

    # only max_tokens may differ: where ours converts, prompts and ids are the official's
    if "convert" not in ours_mct:
        assert_same(
            ours_mct["rendered"], official_mct["rendered"], "rendered prompts between libraries"
        )
        assert_same(
            ours_mct["conversation"], official_mct["conversation"], "conversation between libraries"
        )


BOTH_CASES = [(50, 70), (70, 50), (100, 393_217), (100, 0)]


@pytest.mark.parametrize(("max_tokens", "max_completion_tokens"), BOTH_CASES)
def test_max_completion_tokens_wins_over_max_tokens(max_tokens, max_completion_tokens, tokenizers):
    """DEVIATIONS.md R1: "when both are given, `max_completion_tokens` wins"."""
    body = chat_body(False, max_tokens=max_tokens, max_completion_tokens=max_completion_tokens)
    assert_same(
        summary(ours, "chat", body, tokenizers),
        summary(official, "chat", chat_body(False, max_tokens=max_completion_tokens), tokenizers),
        "ours with both vs official with max_tokens = max_completion_tokens",
    )


@pytest.mark.parametrize("value", [-1, 2**32, 2**40, 1.5, "100", True, [100], None])
def test_max_completion_tokens_values_are_read_like_max_tokens(value, tokenizers):
    """A value that is not a valid `max_tokens` is not silently dropped either: ours answers
    `max_completion_tokens: V` as the official answers `max_tokens: V` (null: no limit)."""
    assert_same(
        summary(ours, "chat", chat_body(True, max_completion_tokens=value), tokenizers),
        summary(official, "chat", chat_body(True, max_tokens=value), tokenizers),
        "ours with max_completion_tokens vs official with max_tokens",
    )


@pytest.mark.parametrize(
    "text",
    [
        # an escaped key is the same key
        '"max\\u005fcompletion_tokens": 7',
        # in front of the messages, after a skipped field, in an array-free body
        '"max_completion_tokens": 7, "junk": {"a": [1, 2]}',
        # a repeated key: the last one, as everywhere else in a body (and in json.loads)
        '"max_completion_tokens": 3, "max_completion_tokens": 7',
    ],
)
def test_max_completion_tokens_read_from_text_as_from_a_dict(text, tokenizers):
    """Bytes bodies read the limit in the same pass as the request; the result is the dict's."""
    body = json.dumps(chat_body(False))
    raw = "{" + text + ", " + body[1:]
    assert_same(
        summary(ours, "chat", raw.encode(), tokenizers),
        summary(ours, "chat", json.loads(raw), tokenizers),
        "ours from bytes vs from the parsed dict",
    )
    assert summary(ours, "chat", raw.encode(), tokenizers)["inference"]["max_tokens"] == 7


# ---------------------------------------------------------------------------------------------
# R2. strict schemas keep the definitions their references point to

ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}}
ADDRESS_STRICT = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
    "additionalProperties": False,
    "required": ["city", "zip"],
}

# (id, schema, the definitions ours must add to the official's normalised schema)
DEFS_CASES = [
    (
        "one-ref-and-an-unused-def",
        {
            "type": "object",
            "properties": {"home": {"$ref": "#/$defs/Address"}, "n": {"type": "integer"}},
            "$defs": {"Address": ADDRESS, "Unused": {"type": "string"}},
        },
        {"$defs": {"Address": ADDRESS_STRICT}},
    ),
    (
        "definitions-keyword",
        {
            "type": "object",
            "properties": {"home": {"$ref": "#/definitions/Address"}},
            "definitions": {"Address": ADDRESS},
        },
        {"definitions": {"Address": ADDRESS_STRICT}},
    ),
    (
        "transitive",
        {
            "type": "object",
            "properties": {"person": {"$ref": "#/$defs/Person"}},
            "$defs": {
                "Person": {"type": "object", "properties": {"home": {"$ref": "#/$defs/Address"}}},
                "Address": ADDRESS,
            },
        },
        {
            "$defs": {
                "Person": {
                    "type": "object",
                    "properties": {"home": {"$ref": "#/$defs/Address"}},
                    "additionalProperties": False,
                    "required": ["home"],
                },
                "Address": ADDRESS_STRICT,
            }
        },
    ),
    (
        "through-items-and-anyOf",
        {
            "type": "object",
            "properties": {"xs": {"type": "array", "items": {"$ref": "#/$defs/X"}}},
            "$defs": {
                "X": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/Address"}]},
                "Address": ADDRESS,
            },
        },
        {
            "$defs": {
                "X": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/Address"}]},
                "Address": ADDRESS_STRICT,
            }
        },
    ),
    (
        "self-recursive",
        {
            "type": "object",
            "properties": {"tree": {"$ref": "#/$defs/Node"}},
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "value": {"type": "integer"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                    },
                }
            },
        },
        {
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "value": {"type": "integer"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                    },
                    "additionalProperties": False,
                    "required": ["value", "children"],
                }
            }
        },
    ),
    (
        # JSON Pointer (RFC 6901): `~1` is `/`, `~0` is `~` in a definition's name
        "escaped-pointer",
        {
            "type": "object",
            "properties": {
                "a": {"$ref": "#/$defs/a~1b"},
                "b": {"$ref": "#/$defs/c~0d"},
            },
            "$defs": {"a/b": {"type": "string"}, "c~d": {"type": "integer"}},
        },
        {"$defs": {"a/b": {"type": "string"}, "c~d": {"type": "integer"}}},
    ),
]


def strict_tool_body(protocol: str, schema: dict) -> dict:
    if protocol == "chat":
        return {
            "model": MODEL,
            "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": "Look it up."}],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "lookup",
                        "description": "Look up a record",
                        "strict": True,
                        "parameters": schema,
                    },
                }
            ],
        }
    return {
        "model": MODEL,
        "reasoning": {"effort": "none"},
        "input": "Look it up.",
        "tools": [
            {
                "type": "function",
                "name": "lookup",
                "description": "Look up a record",
                "strict": True,
                "parameters": schema,
            }
        ],
    }


def strict_format_body(protocol: str, schema: dict) -> dict:
    if protocol == "chat":
        return {
            "model": MODEL,
            "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": "Answer in JSON."}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "strict": True, "schema": schema},
            },
        }
    return {
        "model": MODEL,
        "reasoning": {"effort": "none"},
        "input": "Answer in JSON.",
        "text": {
            "format": {"type": "json_schema", "name": "answer", "strict": True, "schema": schema}
        },
    }


def with_defs(normalised: dict, defs: dict) -> dict:
    out = copy.deepcopy(normalised)
    out.update(copy.deepcopy(defs))
    return out


def differing_lines(a: str, b: str) -> list[tuple[str, str]]:
    lines_a, lines_b = a.split("\n"), b.split("\n")
    assert len(lines_a) == len(lines_b)
    return [(x, y) for x, y in zip(lines_a, lines_b, strict=True) if x != y]


def special_texts(rendered: dict) -> list[str]:
    prompt = rendered["prompt"]
    return [prompt[a:b] for a, b in rendered["special_ranges"]]


@pytest.mark.parametrize("protocol", ["chat", "responses"])
@pytest.mark.parametrize(
    ("schema", "defs"), [c[1:] for c in DEFS_CASES], ids=[c[0] for c in DEFS_CASES]
)
def test_strict_schema_keeps_referenced_defs(protocol, schema, defs, tokenizers):
    body = strict_tool_body(protocol, schema)
    mine = summary(ours, protocol, body, tokenizers)
    theirs = summary(official, protocol, body, tokenizers)
    assert "convert" not in theirs, theirs.get("convert")
    assert "convert" not in mine, mine.get("convert")

    official_params = json.loads(theirs["conversation"]["tools"][0]["parameters"])
    # the official drops every definition, leaving the reference dangling
    assert "$defs" not in official_params
    assert "definitions" not in official_params
    expected = with_defs(official_params, defs)
    assert_same(
        json.loads(mine["conversation"]["tools"][0]["parameters"]), expected, "tool parameters"
    )
    constraint = json.loads(mine["inference"]["output_constraint"]["schema"])
    assert_same(constraint[0]["function"]["parameters"], expected, "tool_call constraint")

    # the rest of the conversion is the official's
    for key in ("parsing", "model_version", "stream"):
        assert_same(mine[key], theirs[key], key)
    mine_conv, theirs_conv = copy.deepcopy(mine["conversation"]), theirs["conversation"]
    mine_conv["tools"][0]["parameters"] = theirs_conv["tools"][0]["parameters"]
    assert_same(mine_conv, theirs_conv, "conversation apart from the tool parameters")

    # the prompts differ in the tool's schema line only, which shows the kept definitions
    for name, rendered in mine["rendered"].items():
        other = theirs["rendered"][name]
        lines = differing_lines(rendered["prompt"], other["prompt"])
        assert len(lines) == 1, (name, lines)
        mine_line, theirs_line = (json.loads(line) for line in lines[0])
        assert_same(mine_line["parameters"], expected, f"{name} tool line")
        assert_same(theirs_line["parameters"], official_params, f"{name} official tool line")
        assert {k: v for k, v in mine_line.items() if k != "parameters"} == {
            k: v for k, v in theirs_line.items() if k != "parameters"
        }
        assert special_texts(rendered) == special_texts(other), name


@pytest.mark.parametrize("protocol", ["chat", "responses"])
@pytest.mark.parametrize(
    ("schema", "defs"), [c[1:] for c in DEFS_CASES], ids=[c[0] for c in DEFS_CASES]
)
def test_strict_response_format_keeps_referenced_defs(protocol, schema, defs, tokenizers):
    """A strict json_schema response format: the output constraint keeps the definitions; the
    response schema and the prompt (which shows the schema as given) are the official's."""
    body = strict_format_body(protocol, schema)
    mine = summary(ours, protocol, body, tokenizers)
    theirs = summary(official, protocol, body, tokenizers)
    assert "convert" not in theirs, theirs.get("convert")
    assert "convert" not in mine, mine.get("convert")
    assert mine["inference"]["output_constraint"]["kind"] == "json"
    official_schema = json.loads(theirs["inference"]["output_constraint"]["schema"])
    assert "$defs" not in official_schema
    assert "definitions" not in official_schema
    assert_same(
        json.loads(mine["inference"]["output_constraint"]["schema"]),
        with_defs(official_schema, defs),
        "json constraint",
    )
    mine_rest, theirs_rest = copy.deepcopy(mine), copy.deepcopy(theirs)
    del mine_rest["inference"]["output_constraint"]["schema"]
    del theirs_rest["inference"]["output_constraint"]["schema"]
    assert_same(mine_rest, theirs_rest, "everything but the constraint schema")


STRICT_WITHOUT_REFS = {
    "flat": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
    "nested-arrays-anyOf-enum": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"x": {"type": "number"}}},
            },
            "choice": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "additionalProperties": False,
    },
    "unreferenced-defs": {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "$defs": {"Unused": ADDRESS},
    },
}


@pytest.mark.parametrize("kind", ["tool", "response_format"])
@pytest.mark.parametrize("protocol", ["chat", "responses"])
@pytest.mark.parametrize(
    "schema", list(STRICT_WITHOUT_REFS.values()), ids=list(STRICT_WITHOUT_REFS)
)
def test_strict_schema_without_refs_is_identical(kind, protocol, schema, tokenizers):
    """No `$ref`: nothing to keep, so everything is the official's, prompts byte for byte."""
    make = strict_tool_body if kind == "tool" else strict_format_body
    body = make(protocol, schema)
    mine = summary(ours, protocol, body, tokenizers)
    theirs = summary(official, protocol, body, tokenizers)
    assert "convert" not in theirs, theirs.get("convert")
    assert_same(mine, theirs, "ours vs official")
    for name, rendered in mine["rendered"].items():
        assert rendered["prompt"] == theirs["rendered"][name]["prompt"]


# ---------------------------------------------------------------------------------------------
# R4


def unanswered_message(M: Any, calls: list[str], answered: list[str]) -> str:
    items: list[dict] = [{"role": "user", "content": "q"}]
    items += [
        {"type": "function_call", "call_id": c, "name": "f", "arguments": "{}"} for c in calls
    ]
    items += [{"type": "function_call_output", "call_id": c, "output": "r"} for c in answered]
    items.append({"role": "user", "content": "next"})
    body = {"model": MODEL, "input": items, "tools": [{"type": "function", "name": "f"}]}
    with pytest.raises(M.ConversionError) as err:
        M.ResponsesRequest(body).convert(M.ConversionOptions())
    return str(err.value)


@pytest.mark.parametrize(
    ("calls", "answered"),
    [(["a", "b", "c"], []), (["c", "b", "a"], ["b"]), (["x1", "x2"], ["x2"]), (["z", "y"], [])],
)
def test_first_unanswered_call_is_named(calls, answered):
    missing = [c for c in calls if c not in answered]
    for _ in range(3):
        assert unanswered_message(ours, calls, answered) == (
            f"No tool output found for tool call {missing[0]}."
        )
    theirs = unanswered_message(official, calls, answered)
    assert theirs in {f"No tool output found for tool call {c}." for c in missing}
