"""Requests whose output a grammar-enforcing server must finish in a few tokens, whatever its
model: a forced tool call (tool_choice required or named, one call) or a json_schema output,
with schemas of booleans and enums only (issue 24).

The generated bodies of `cases` rarely force a tool and their schemas have free strings and
numbers, which a model with random weights never closes within a small output cap; with these
the tool-choice and response-format properties of `deepring conformance` see finished outputs.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .context import KNOWN_MODELS
from .values import texts

# The output cap of these requests: a one-call DSML block of two parameters fits.
MAX_TOKENS = 96
TOOL_NAMES = ["get_color", "set_flag", "pick"]
KEYS = ["ok", "color", "mode", "b"]


@st.composite
def bounded_schema(draw) -> dict:
    """A strict-compatible object schema: 1-2 properties, booleans, string enums and small
    objects, all required, no additional properties (a DSML call of it is 30-80 tokens)."""
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))
    props: dict[str, Any] = {}
    for key in keys:
        kind = draw(st.sampled_from(["boolean", "enum", "boolean", "enum", "object"]))
        if kind == "boolean":
            props[key] = {"type": "boolean"}
        elif kind == "enum":
            values = draw(
                st.lists(
                    st.sampled_from(["red", "green", "a b", "日本"]),
                    min_size=1,
                    max_size=3,
                    unique=True,
                )
            )
            props[key] = {"type": "string", "enum": values}
        else:
            props[key] = {
                "type": "object",
                "properties": {"on": {"type": "boolean"}},
                "required": ["on"],
                "additionalProperties": False,
            }
    return {"type": "object", "properties": props, "required": keys, "additionalProperties": False}


@st.composite
def bounded_cases(draw, protocol: str) -> dict:
    """{"protocol", "body", "max_tokens", "faults": []}: a valid body that forces its output."""
    kind = draw(st.sampled_from(["json_schema", "required", "named"]))
    text = "Answer. " + draw(texts(2))
    body: dict[str, Any] = {"model": KNOWN_MODELS[0]}
    if protocol == "responses":
        body |= {"input": text, "reasoning": {"effort": "none"}, "max_output_tokens": MAX_TOKENS}
    else:
        body |= {"messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS}
        body["thinking"] = {"type": "disabled"}  # forced tool choice needs non-thinking mode
    if kind == "json_schema":
        schema = draw(bounded_schema())
        if protocol == "chat":
            spec = {"name": "out", "schema": schema, "strict": True}
            body["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif protocol == "responses":
            spec = {"type": "json_schema", "name": "out", "schema": schema, "strict": True}
            body["text"] = {"format": spec}
        else:
            body["output_format"] = {"type": "json_schema", "schema": schema}
        return {"protocol": protocol, "body": body, "max_tokens": MAX_TOKENS, "faults": []}
    names = draw(st.lists(st.sampled_from(TOOL_NAMES), min_size=1, max_size=2, unique=True))
    tools = [(name, draw(bounded_schema())) for name in names]
    forced = draw(st.sampled_from(names))
    if protocol == "chat":
        body["tools"] = [
            {"type": "function", "function": {"name": n, "parameters": s, "strict": True}}
            for n, s in tools
        ]
        body["tool_choice"] = (
            "required" if kind == "required" else {"type": "function", "function": {"name": forced}}
        )
        body["parallel_tool_calls"] = False
    elif protocol == "responses":
        body["tools"] = [
            {"type": "function", "name": n, "parameters": s, "strict": True} for n, s in tools
        ]
        body["tool_choice"] = (
            "required" if kind == "required" else {"type": "function", "name": forced}
        )
        body["parallel_tool_calls"] = False
    else:
        body["tools"] = [{"name": n, "input_schema": s} for n, s in tools]
        choice = {"type": "any"} if kind == "required" else {"type": "tool", "name": forced}
        body["tool_choice"] = {**choice, "disable_parallel_tool_use": True}
    return {"protocol": protocol, "body": body, "max_tokens": MAX_TOKENS, "faults": []}
