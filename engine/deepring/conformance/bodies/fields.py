"""Request options shared by the protocols: thinking, sampling, max tokens, model,
tool choice, response format, stop sequences."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .context import KNOWN_MODELS, OTHER_MODELS, Ctx
from .schemas import tool_parameters
from .values import texts


def thinking_is_off(ctx: Ctx, switch: str | None, effort: str | None) -> bool:
    """Whether the request certainly converts outside thinking mode (`switch` is the thinking
    type, "disabled" / "enabled" / ..., `effort` the effort alias)."""
    if switch is not None:
        return switch == "disabled"
    if effort is not None:
        return effort == "none"
    return not ctx.default_thinking


def sampling_options(ctx: Ctx, body: dict) -> None:
    if ctx.chance(30):
        body["temperature"] = ctx.pick_faulty(
            "temperature", [0.3, 0, 0.7, 1, 1.5, 2], [2.0001, -0.1, 3]
        )
    if ctx.chance(30):
        body["top_p"] = ctx.pick_faulty(
            "top_p", [0.5, 0.1, 0.9, 0.95, 0.99, 1, 1.0], [0, -0.5, 1.01]
        )


def max_token_value(ctx: Ctx) -> int:
    bound = ctx.upper_bound
    if ctx.fault("max_tokens", 70):
        return ctx.pick([0, bound + 1, 400000, 2**32 - 1, 2**31])
    return ctx.draw(st.one_of(st.integers(1, min(bound, 4096)), st.sampled_from([1, bound])))


def model_name(ctx: Ctx) -> str:
    if ctx.fault("model", 80):
        return ctx.pick([m for m in OTHER_MODELS + KNOWN_MODELS if m not in ctx.models])
    return ctx.pick(ctx.models)


def tool_choice_mode(ctx: Ctx, thinking_off: bool, tool_names: list[str]) -> tuple | None:
    """None (field absent), ("auto"|"none"|"required",) or ("named", name)."""
    if not ctx.chance(40):
        return None
    if thinking_off or ctx.fault("tool_choice", 80):
        choice = ctx.pick(["auto", "none", "required", "named"])
    else:
        choice = ctx.pick(["auto", "none"])
    if choice == "named":
        if not tool_names or ctx.fault("tool_choice", 30):
            return ("named", "nope")
        return ("named", ctx.pick(tool_names))
    return (choice,)


def response_format_spec(ctx: Ctx, tools: list[dict]) -> dict | None:
    """{"type": ...} plus "schema"/"strict"/"name" for json_schema, "regex" for regex. Any
    response_format with strict tools is a 400, json_schema with any tools too."""
    has_tools = bool(tools)
    if any(t.get("strict") is True for t in tools) and not ctx.fault("format_with_tools", 80):
        return None
    kinds = ["json_object", "text", "regex"]
    if not has_tools or ctx.fault("format_with_tools", 80):
        kinds.append("json_schema")
    kind = ctx.pick(kinds)
    if kind == "json_object":
        ctx.json_hint = not ctx.fault("json_word", 90)
    if kind != "json_schema":
        return {"type": kind, "regex": ctx.pick(["a+", "[0-9]{3}", "(yes|no)"])}
    strict = ctx.pick([None, False, True])
    schema = tool_parameters(ctx, strict is True)
    if strict is not True and ctx.chance(10):
        schema = {"type": "string"}
    spec = {"type": kind, "name": ctx.pick(["out", "x", "a-b"]), "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    if ctx.chance(30):
        spec["description"] = "desc"
    return spec


def stop_value(ctx: Ctx, allow_string: bool) -> Any:
    if ctx.fault("stop", 80):
        return ctx.pick([[""], [str(i) for i in range(17)], ["a", ""]])
    stops = ctx.draw(st.lists(texts(2, min_size=1).filter(bool), max_size=4))
    if allow_string and len(stops) == 1 and ctx.chance(50):
        return stops[0]
    return stops
