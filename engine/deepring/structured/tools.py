"""The DSML tool-call grammar of a tool list.

A block, as the V4 prompt shows it (V4.1 spells the tags ` calls`, ` invoke`, ` parameter`),
where `｜DSML｜` is the special token, never text:

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="KEY" string="false">JSON value</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

The recipe's stream parser turns each parameter into `"KEY": value` of the call's arguments:
the key is copied raw up to the next space (so a key must need no JSON escaping and hold no
whitespace), a `string="true"` value is JSON-escaped (any raw text is a JSON string),
a `string="false"` value is copied raw (it must be JSON). So the arguments satisfy the tool's
schema when:
- only declared tool names are invoked;
- each declared property appears at most once, in declaration order, the required ones always
  (a required name missing from `properties` takes `additionalProperties`' schema), and no
  other key;
- a `string="true"` value matches the property's string constraints (a raw-text regex built
  here from `enum`, `const`, `pattern`, `minLength`, `maxLength`; offered only when those are
  all the property says), and a `string="false"` value is a JSON value of the property's
  schema (llguidance's `%json`, with the tool's `$defs` / `definitions` alongside).

Exact tools (strict ones, or every tool under tool_choice required / named) must compile as
they are: a schema llguidance cannot enforce, or a top-level keyword this grammar cannot
(`allOf`, `patternProperties`, `minProperties`...) is a GrammarError. Other tools are lenient:
unknown keywords are ignored, and a tool whose parameters still do not compile is called with
any subset of its declared parameters holding any JSON (the block stays well-formed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from deepring.structured.grammar import (
    GrammarError,
    Markers,
    json_value,
    regex_terminal,
    special,
    validate,
)

# Top-level keywords of a tool's parameters the grammar honours (or that say nothing about
# the value).
_TOP_KEYS = frozenset(
    {"type", "properties", "required", "additionalProperties", "description", "title", "$defs",
     "definitions", "$schema", "$id", "$comment", "default", "examples", "strict"}
)  # fmt: skip
# Keywords a raw string="true" value can be checked for; anything else goes the JSON way.
_RAW_KEYS = frozenset(
    {"type", "enum", "const", "pattern", "minLength", "maxLength", "description", "title",
     "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)  # fmt: skip
# A parameter name the parser copies into valid JSON: no quote, backslash, whitespace or
# control character (the name runs to the next space; its quotes are the model's own).
_SAFE_KEY = re.compile(r'[^"\\\s\x00-\x1f\x7f]+')
_META = frozenset("\\.+*?()|[]{}^$#&-~")
_ANCHOR_OUTSIDE_CLASS = re.compile(r"(?<!\\)[\^$]")


@dataclass(frozen=True)
class _Tags:
    block: str
    invoke: str
    parameter: str

    @classmethod
    def of(cls, v41: bool) -> _Tags:
        return (
            cls(" calls", " invoke", " parameter")
            if v41
            else cls("tool_calls", "invoke", "parameter")
        )


def _lit(text: str) -> str:
    """A Lark string literal (the texts here hold no quote or backslash of their own except the
    escapes written below, so JSON string syntax is Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def _escape(text: str) -> str:
    """`text` as a literal in Rust regex syntax (Python's re.escape also escapes characters,
    such as a space, that Rust refuses to see escaped)."""
    return "".join("\\" + c if c in _META else c for c in text)


def _strings_only(schema: dict) -> bool:
    t = schema.get("type")
    if t == "string" or t == ["string"]:
        return True
    for key in ("enum",):
        if key in schema and all(isinstance(v, str) for v in schema[key]):
            return True
    return "const" in schema and isinstance(schema["const"], str)


def _pattern_regex(pattern: str) -> str | None:
    """A regex whose full matches all contain a match of the JSON Schema `pattern` (which
    searches): `^p$` becomes p, an unanchored side gets any text. None when the pattern has
    anchors elsewhere."""
    body, head, tail = pattern, "(?s:.*)", "(?s:.*)"
    if body.startswith("^"):
        body, head = body[1:], ""
    if body.endswith("$") and not body.endswith("\\$"):
        body, tail = body[:-1], ""
    if _ANCHOR_OUTSIDE_CLASS.search(re.sub(r"\[[^\]]*\]", "", body)):
        return None
    return f"{head}(?:{body}){tail}"


def _raw_terminal(schema: dict) -> str | None:
    """The terminal expression (before the closing `</`) of a string="true" value of `schema`,
    or None when a raw value cannot carry it exactly."""
    if set(schema) - _RAW_KEYS:
        return None
    t = schema.get("type")
    if t is not None and t != "string" and not (isinstance(t, list) and "string" in t):
        return None
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    if not isinstance(lo, int) or (hi is not None and not isinstance(hi, int)):
        return None
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else list(schema["enum"])
        values = [v for v in values if isinstance(v, str) and lo <= len(v) <= (hi or len(v))]
        if "pattern" in schema:
            return None  # both: left to %json
        if not values:
            return None
        return regex_terminal("|".join(f"(?:{_escape(v)})" for v in values))
    parts = [f"/(?s:.{{{lo},{'' if hi is None else hi}}})/"]
    if "pattern" in schema:
        p = _pattern_regex(schema["pattern"])
        if p is None:
            return None
        parts.append(regex_terminal(p, "dw"))
    return " & ".join(parts)


class _Builder:
    def __init__(self, markers: Markers) -> None:
        self.dsml = special(markers.dsml, "｜DSML｜")
        self.tags = _Tags.of(markers.v41)
        self.rules: list[str] = []

    def close(self, tag: str, newline: bool = True) -> str:
        """`</｜DSML｜tag>` (+ newline)."""
        return f'"</" {self.dsml} {_lit(tag + (">" + chr(10) if newline else ">"))}'

    def param(self, name: str, key: str, schema: Any, defs: dict, lenient: bool) -> str:
        """Rule `name`: one parameter `key` of `schema`."""
        d, tags = self.dsml, self.tags
        head = f'"<" {d} {_lit(tags.parameter + " name=" + chr(34) + key + chr(34) + " string=")}'
        forms = []
        raw = _raw_terminal(schema) if isinstance(schema, dict) else None
        if raw is not None:
            self.rules.append(f"{name.upper()}_C: {raw}")
            self.rules.append(f'{name.upper()}_V: {name.upper()}_C "</"')
            forms.append(
                f'"\\"true\\">" {name.upper()}_V {d} {_lit(tags.parameter + ">" + chr(10))}'
            )
        if raw is None or not _strings_only(schema):
            if isinstance(schema, dict) and defs:
                schema = {**defs, **schema}
            self.rules.append(f"{name}_j: {json_value(schema, lenient=lenient)}")
            forms.append(f'"\\"false\\">" {name}_j {self.close(tags.parameter)}')
        self.rules.append(f"{name}: {head} ({' | '.join(forms)})")
        return name

    def call(self, i: int, tool: dict, exact: bool) -> str:
        """Rule `call_i`: the rest of an invoke of tool i (its name, parameters, close)."""
        fn = tool.get("function") or {}
        name = fn.get("name") or ""
        params = fn.get("parameters")
        params = params if isinstance(params, dict) else {}
        extra = set(params) - _TOP_KEYS
        if exact and extra:
            raise GrammarError(
                f"tool {name!r}: constrained tool calls cannot enforce the parameters keyword "
                f"{sorted(extra)[0]!r}"
            )
        props = params.get("properties") or {}
        required = [r for r in params.get("required") or () if isinstance(r, str)]
        additional = params.get("additionalProperties", True)
        defs = {k: params[k] for k in ("$defs", "definitions") if k in params}
        keys = list(props) + [r for r in required if r not in props]
        items = []
        for j, key in enumerate(keys):
            need = key in required
            if not _SAFE_KEY.fullmatch(key):
                if exact and need:
                    raise GrammarError(
                        f"tool {name!r}: the required parameter {key!r} cannot be written in a "
                        "DSML tool call (quotes, backslashes or whitespace in its name)"
                    )
                continue
            if key in props:
                schema = props[key]
            elif additional is False:
                if exact:
                    raise GrammarError(
                        f"tool {name!r}: {key!r} is required but neither a property nor allowed "
                        "by additionalProperties"
                    )
                continue
            else:
                schema = additional if isinstance(additional, dict) else {}
            rule = self.param(f"p{i}_{j}", key, schema, defs, lenient=not exact)
            items.append(rule if need else f"{rule}?")
        body = " ".join(items)
        if not items and self.tags.invoke.startswith(" "):
            body = '"\\n"?'  # V4.1 renders an invoke without arguments with a blank line
        self.rules.append(
            f"call{i}: {_lit(name + chr(34) + '>' + chr(10))} {body} {self.close(self.tags.invoke)}"
        )
        return f"call{i}"

    def loose_call(self, i: int, tool: dict) -> str:
        """A lenient tool whose schemas do not compile: any of its safe property names, each at
        most once and in order, holding any string or JSON value."""
        fn = dict(tool.get("function") or {})
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
        props = {k: {} for k in (params.get("properties") or {}) if _SAFE_KEY.fullmatch(k)}
        fn["parameters"] = {"type": "object", "properties": props}
        return self.call(i, {"function": fn}, exact=False)


def _invoke_rules(
    tools: list[dict], markers: Markers, exact_all: bool, single: bool = False
) -> list[str]:
    """The rules `calls` (one or more invokes, then the block's end; exactly one when single)
    and what it needs."""
    b = _Builder(markers)
    calls = []
    for i, tool in enumerate(tools):
        exact = exact_all or (tool.get("function") or {}).get("strict") is True
        mark = len(b.rules)
        rule = b.call(i, tool, exact)
        if not exact:
            # A lenient tool checked alone: when llguidance still refuses its parameters, it is
            # called with loose ones instead of failing the request.
            trial = "\n".join(["%llguidance {}", f"start: {rule}", *b.rules[mark:]])
            if validate(trial) is not None:
                del b.rules[mark:]
                rule = b.loose_call(i, tool)
        calls.append(rule)
    if not calls:
        raise GrammarError("a tool-call constraint needs at least one tool")
    d = b.dsml
    return [
        f"calls: invoke{'' if single else '+'} {b.close(b.tags.block, newline=False)}",
        f'invoke: "<" {d} {_lit(b.tags.invoke + " name=" + chr(34))} ({" | ".join(calls)})',
        *b.rules,
    ]


def tool_call_grammar(
    tools: list[dict],
    *,
    required: bool,
    reasoning: bool,
    markers: Markers,
    single: bool = False,
    must_call: bool = False,
) -> str:
    """The grammar of an output that calls `tools` (the recipe's constraint schema: Chat
    Completions function tools). required: the prompt already opened the block (tool_choice
    required or named), so the output is one or more invokes and the block's end, and every
    tool is exact. must_call (Messages tool_choice any, whose prompt does not open the block;
    not in thinking mode): the output opens the block at once, then as required. Otherwise
    (auto) the output is any text, optionally followed by one block (nothing may follow a
    block); with reasoning, the block may also open inside the reasoning, which the parser
    allows, and the reasoning may end the output. single: a block holds exactly one invoke
    (parallel_tool_calls false, disable_parallel_tool_use)."""
    rules = _invoke_rules(tools, markers, exact_all=required or must_call, single=single)
    d = special(markers.dsml, "｜DSML｜")
    opener = _lit(_Tags.of(markers.v41).block + ">" + chr(10))
    head = ["%llguidance {}"]
    if required:
        head.append("start: calls")
    elif must_call:
        if reasoning:
            raise GrammarError("a forced tool call cannot follow reasoning")
        head.append(f'start: "<" {d} {opener} calls')
    else:
        answer = f"TEXT? | OPEN {d} {opener} calls"
        if reasoning:
            te = special(markers.think_end, "</think>")
            head.append(f"start: {answer} | TEXT? {te} content")
            head.append(f"content: {answer}")
        else:
            head.append(f"start: {answer}")
        # A block opens at `<` + ｜DSML｜: the text before it ends with that `<` (one lexeme, so
        # text may hold other `<`s and the block still opens only at the special token).
        head += ["TEXT: /(?s:.+)/", "OPEN: /(?s:.*)</"]
    return "\n".join([*head, *rules]) + "\n"
