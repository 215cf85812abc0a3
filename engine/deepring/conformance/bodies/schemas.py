"""JSON schemas (tool parameters, json_schema formats) and the abstract tools."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .context import Ctx
from .values import CHARS, chance, short_texts

PROPERTY_NAMES = [
    "a",
    "city",
    "days",
    "items",
    "type",
    "properties",
    "$defs",
    "definitions",
    "日本",
    "with space",
    "emoji😀",
    "",
    "x-y",
]
CLEAN_FORMATS = ["email", "hostname", "ipv4", "ipv6", "uuid"]
BAD_LEAVES = [
    {"type": "strin"},
    {"type": 5},
    {"type": "array"},
    {"type": "string", "minLength": -1},
    {"allOf": []},
    {"type": "string", "description": 5},
    {"$ref": "#/$defs/Missing"},
    {"type": ["object", "null"]},
    {"required": "a", "type": "object", "properties": {"a": {"type": "string"}}},
    {"type": "array", "items": [{"type": "string"}]},
    {"type": "number", "multipleOf": 0},
    {"type": "integer", "minimum": 0.5},
    {"type": "string", "enum": ["x", None]},
    {"anyOf": [{"type": ["string", "null"]}]},
    {"anyOf": [{"anyOf": [{"type": "string"}]}]},
]
# accepted without `strict`, rejected by strict normalisation
NON_STRICT_LEAVES = [
    {},
    True,
    {"type": "object"},
    {"type": "object", "properties": {}},
    {"enum": [1, "x", None]},
    {"const": "x"},
    {"allOf": [{"type": "string"}]},
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    {"not": {"type": "string"}},
    {"type": "string", "format": "date-time"},
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {}},
]


@st.composite
def string_schema(draw, strict: bool) -> dict:
    schema: dict[str, Any] = {"type": "string"}
    if chance(draw, 50):
        schema["description"] = draw(short_texts)
    extra = draw(st.sampled_from(["none", "enum", "pattern", "format", "lengths", "annotations"]))
    if extra == "enum":
        schema["enum"] = draw(st.lists(short_texts, min_size=1, max_size=3))
    elif extra == "pattern":
        schema["pattern"] = draw(st.sampled_from(["^a+$", "[0-9]{3}", "."]))
    elif extra == "format":
        schema["format"] = draw(st.sampled_from(CLEAN_FORMATS))
    elif extra == "lengths":
        schema["minLength"] = draw(st.integers(0, 3))
        schema["maxLength"] = draw(st.integers(3, 9))
    elif extra == "annotations":
        schema["title"] = "T"
        schema["default"] = "d"
        schema["examples"] = ["e"]
    return schema


@st.composite
def number_schema(draw) -> dict:
    kind = draw(st.sampled_from(["integer", "number"]))
    schema: dict[str, Any] = {"type": kind}
    # strict normalisation reads the bounds of an integer as i64; multipleOf must be > 0
    values = [1, 5, 100, -3] if kind == "integer" else [1, 5, 0.5, 100, -2.5, 1e-7]
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if chance(draw, 25):
            schema[key] = draw(st.sampled_from(values))
    if chance(draw, 20):
        schema["multipleOf"] = draw(st.sampled_from([v for v in values if v > 0]))
    if chance(draw, 20):
        schema["description"] = draw(short_texts)
    return schema


def leaf_schemas(strict: bool, refs: list[str], bad: bool) -> st.SearchStrategy[Any]:
    options: list[st.SearchStrategy[Any]] = [
        string_schema(strict),
        number_schema(),
        st.sampled_from([{"type": "boolean"}, {"type": "null"}]),
    ]
    if not strict:
        options.append(
            st.sampled_from([{"type": ["string", "null"]}, {"type": ["integer", "string"]}])
        )
    if refs:
        options.append(st.sampled_from(refs).map(lambda r: {"$ref": r}))
        options.append(st.sampled_from(refs).map(lambda r: {"$ref": r, "description": "d"}))
    if not strict:
        options.append(st.sampled_from(NON_STRICT_LEAVES))
    if bad:
        options.append(st.sampled_from(BAD_LEAVES + ([] if not strict else NON_STRICT_LEAVES)))
    return st.one_of(*options)


@st.composite
def object_schema(draw, children: st.SearchStrategy[Any], strict: bool, bad: bool) -> dict:
    names = draw(
        st.lists(
            st.one_of(st.sampled_from(PROPERTY_NAMES), st.text(alphabet=CHARS, max_size=4)),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    schema: dict[str, Any] = {"type": "object"}
    if chance(draw, 25):
        schema["description"] = draw(short_texts)
    schema["properties"] = {name: draw(children) for name in names}
    # strict normalisation requires `required` to list every property when present
    if strict:
        required = draw(st.sampled_from(["all", "absent"]))
    else:
        required = draw(st.sampled_from(["all", "absent", "some"]))
    if required == "all":
        schema["required"] = list(names)
    elif required == "some":
        schema["required"] = names[: len(names) // 2]
    if chance(draw, 10):
        schema["additionalProperties"] = False
    if chance(draw, 10):
        schema["title"] = draw(short_texts)
    if bad and chance(draw, 20):
        schema.update(
            draw(
                st.sampled_from(
                    [
                        {"additionalProperties": True},
                        {"additionalProperties": {"type": "string"}},
                        {"required": ["zzz"]},
                        {"required": names[:-1]},
                        {"patternProperties": {"^x": {"type": "string"}}},
                    ]
                )
            )
        )
    return schema


def schemas(strict: bool, refs: list[str], bad: bool, max_leaves: int = 6) -> st.SearchStrategy:
    def extend(children):
        # strict normalisation wants a `type` on every anyOf variant
        variants = (
            children.filter(lambda s: isinstance(s, dict) and isinstance(s.get("type"), str))
            if strict
            else children
        )
        return st.one_of(
            object_schema(children, strict, bad),
            st.builds(
                lambda items, extra: {"type": "array", "items": items, **extra},
                children,
                st.sampled_from([{}, {"minItems": 1}, {"maxItems": 3, "uniqueItems": True}]),
            ),
            st.lists(variants, min_size=1, max_size=3).map(lambda xs: {"anyOf": xs}),
        )

    return st.recursive(leaf_schemas(strict, refs, bad), extend, max_leaves=max_leaves)


BAD_TOP_LEVEL = [
    {"type": "string"},
    [1],
    {"type": ["object"]},
    {"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}}]},
    {"$ref": "#/$defs/X", "$defs": {"X": {"type": "object"}}},
    {"type": "object", "properties": "x"},
    {},
    True,
    {"properties": {"a": {"type": "string"}}},
]
ODD_TOP_LEVEL = [{"type": "object"}, None]


def tool_parameters(ctx: Ctx, strict: bool) -> Any:
    """Top-level tool / json_schema parameters: an object schema, sometimes with $defs."""
    draw = ctx.draw
    bad = ctx.fault("schema", 70)
    if bad and ctx.chance(25):
        return ctx.pick(BAD_TOP_LEVEL + ODD_TOP_LEVEL)
    if not strict and ctx.chance(5):
        return ctx.pick(ODD_TOP_LEVEL)
    refs: list[str] = []
    defs: dict[str, Any] = {}
    style = None
    if ctx.chance(25):
        style = ctx.pick(["$defs", "definitions"])
        names = draw(st.lists(st.sampled_from(["Pet", "Addr", "X"]), min_size=1, unique=True))
        refs = [f"#/{style}/{name}" for name in names]
        # definition bodies are always strict-clean: deepring_recipe keeps (and normalises)
        # the definitions a kept $ref points to, the official drops them unread (deviation 2)
        for name in names:
            defs[name] = draw(schemas(True, [], False, max_leaves=3))
    schema = draw(object_schema(schemas(strict, refs, bad), strict, bad))
    if style is not None:
        schema[style] = defs
    if ctx.chance(10):
        schema["$comment"] = "odd keys"
        schema["x-vendor"] = {"k": [1, 2]}
    return schema


VALID_TOOL_NAMES = ["get_weather", "search", "f", "g", "run-code", "X_1", "a" * 65]
INVALID_TOOL_NAMES = ["bad name", "näme", "a.b", "", "ns::f"]


def tool_specs(ctx: Ctx, max_tools: int = 4, strictness: Any = "draw") -> list[dict]:
    """Abstract tools: name, description, parameters (or absent), strict, defer_loading."""
    draw = ctx.draw
    count = draw(st.integers(1, max_tools))
    names = draw(
        st.lists(st.sampled_from(VALID_TOOL_NAMES), min_size=count, max_size=count, unique=True)
    )
    if ctx.fault("tool_name", 70):
        if ctx.chance(50):
            names[0] = ctx.pick(INVALID_TOOL_NAMES)
        else:
            names.append(names[0])
    # strictness is uniform unless a fault mixes it (mixing is a 400)
    if strictness == "draw":
        strictness = ctx.pick([None, True, False, True])
    tools = []
    for name in names:
        strict = strictness
        if ctx.fault("strict_mix", 40):
            strict = ctx.pick([None, False, True])
        tool: dict[str, Any] = {"name": name, "strict": strict}
        if ctx.chance(75):
            tool["description"] = ctx.draw(st.one_of(short_texts, st.none()))
        if not ctx.chance(10):
            tool["parameters"] = tool_parameters(ctx, strict is True)
        tool["defer_loading"] = ctx.chance(25)
        tools.append(tool)
    return tools
