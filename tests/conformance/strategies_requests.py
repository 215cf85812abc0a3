"""Hypothesis strategies for request bodies of the three protocols (issue 3).

`request_cases(protocol)` draws {"protocol", "body", "options"}: a request body (a dict, or its
JSON as str or bytes) for OpenAI Chat Completions ("chat"), OpenAI Responses ("responses") or
Anthropic Messages ("messages"), and a ConversionOptions spec (see `summary.build_options`).

How a case is drawn:

1. a ConversionOptions spec (defaults half of the time; aliases, thinking default, reasoning
   behaviour, web-search behaviours, max-token bounds, special-token overrides otherwise);
2. a *fault set*: empty for about 45% of the cases, else one or two fault kinds of
   the protocol (`FAULTS`). With no fault every choice is made among values the official
   accepts, so most such cases convert; each fault kind opens one family of invalid choices
   (out-of-range options, broken tool histories, bad images, invalid schemas, wrong enum
   values, a generic structural mutation, ...);
3. an abstract conversation script (system / user / reminder / assistant steps with
   reasoning and tool calls / tool results / trailing or prefix assistant), rendered into the
   protocol's shapes, and the protocol's options.

Hypothesis favours the simplest choice (0, the first element, False) well beyond its uniform
share in nested draws, so every choice is arranged with the simplest value being valid and
`Ctx.chance` is False on 0.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import strategies as st

KNOWN_MODELS = ["DeepSeek-V4.1-Flash", "DeepSeek-V4-Pro"]
OTHER_MODELS = ["gpt-4o", "deepseek-chat", "", "deepseek-v4-pro", "DeepSeek-V4.1-Flash "]

# ---------------------------------------------------------------------------------------------
# text

FRAGMENTS = [
    "hello",
    " world",
    "json",
    "JSON",
    "\n",
    "\n\n",
    "  ",
    "\t",
    "\r\n",
    '"',
    "\\",
    "{",
    "}",
    "'",
    "日本語",
    "中文",
    "Привет",
    "😀",
    "👨\u200d👩\u200d👧",
    "e\u0301",
    "\u2028",
    "\u00a0",
    "\x00",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜System｜>",
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜DSML｜tool_calls>",
    "</｜DSML｜parameter>",
    "<｜image｜>",
    "<｜latest_reminder｜>",
    "<tool_result>",
    "</tool_result>",
    "## Tools",
    "1e-7",
    "12345678901234567890",
]
CHARS = st.characters(blacklist_categories=("Cs",))


def texts(max_fragments: int = 5, min_size: int = 0) -> st.SearchStrategy[str]:
    piece = st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet=CHARS, max_size=8))
    return st.lists(piece, min_size=min_size, max_size=max_fragments).map("".join)


short_texts = texts(3)

# ---------------------------------------------------------------------------------------------
# JSON values (tool-call arguments)

SPECIAL_FLOATS = [
    0.0,
    -0.0,
    1.0,
    0.1,
    1e-5,
    1.5e-5,
    1e-6,
    1.234e-6,
    1e-7,
    1e16,
    1e21,
    1.5e300,
    1.2345678901234568e16,
    -2.5,
    123456.789,
]
SPECIAL_INTS = [0, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1]
BIG_INTS = [2**64, 10**23, -(2**63) - 1]

json_keys = st.one_of(
    st.sampled_from(["a", "city", "days", "q", "日本", "with space", "", "emoji😀", 'q"uote']),
    st.text(alphabet=CHARS, max_size=5),
)


def json_leaves(big_ints: bool = False) -> st.SearchStrategy[Any]:
    ints = st.one_of(st.integers(-1000, 1000), st.sampled_from(SPECIAL_INTS))
    if big_ints:
        ints = st.one_of(ints, st.sampled_from(BIG_INTS))
    return st.one_of(
        st.none(),
        st.booleans(),
        ints,
        st.sampled_from(SPECIAL_FLOATS),
        st.floats(allow_nan=False, allow_infinity=False),
        short_texts,
    )


def json_values(big_ints: bool = False, max_leaves: int = 8) -> st.SearchStrategy[Any]:
    return st.recursive(
        json_leaves(big_ints),
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(json_keys, children, max_size=3),
        ),
        max_leaves=max_leaves,
    )


ODD_ARGUMENTS = [
    "{bad",
    "[1,2]",
    '"str"',
    "",
    "1e400",
    '{"a": 1e400}',
    "null",
    '{"a": 1, "a": 2}',
    '{"a":1} trailing',
    '{"deep": {"x": [1, {"y": null}]}, "n": -0.0}',
    '{"s": "</｜DSML｜parameter>\\n\\"q\\""}',
]


def chance(draw, percent: int) -> bool:
    """True with about `percent`% probability; False for hypothesis' favourite value 0."""
    return draw(st.integers(0, 99)) >= 100 - percent


@st.composite
def argument_strings(draw) -> str:
    """Chat / Responses tool-call `arguments`: JSON text of an object, or something else
    (which the official renders as a single raw `arguments` parameter)."""
    if chance(draw, 20):
        return draw(st.sampled_from(ODD_ARGUMENTS))
    value = draw(st.dictionaries(json_keys, json_values(big_ints=True), max_size=4))
    style = draw(st.sampled_from(["default", "compact", "raw", "spaced"]))
    if style == "compact":
        return json.dumps(value, separators=(",", ":"))
    if style == "raw":
        return json.dumps(value, ensure_ascii=False)
    if style == "spaced":
        return " " + json.dumps(value, indent=1) + "\n"
    return json.dumps(value)


# ---------------------------------------------------------------------------------------------
# the per-case context

FAULTS = {
    "common": [
        "mutation",
        "model",
        "temperature",
        "top_p",
        "max_tokens",
        "tool_choice",
        "tool_name",
        "schema",
        "strict_mix",
        "image",
        "history",
        "json_word",
        "format_with_tools",
        "enum",
    ],
    "chat": [
        "n",
        "logprobs",
        "seed",
        "stop",
        "penalty",
        "stream_options",
        "role",
        "file",
        "prefix",
    ],
    "responses": ["input", "custom_tool", "tool_choice_shape", "server_tool"],
    "messages": ["content", "server_tool", "tool_addition", "deferred", "block", "stop"],
}


class Ctx:
    """Draw helpers of one case: probabilities, the fault set and what the options accept."""

    def __init__(self, draw, protocol: str, faults: set[str], options: dict) -> None:
        self.draw = draw
        self.protocol = protocol
        self.faults = faults
        self.options = options
        models = list(KNOWN_MODELS)
        default_thinking = True
        for key, value in options.get("ctor", {}).items():
            if key == "default_thinking_mode":
                default_thinking = value
        for step in options.get("with", []):
            if step[0] == "model_versions_by_name":
                models = list(step[1])
            elif step[0] == "model_alias" and step[1] not in models:
                models.append(step[1])
            elif step[0] == "default_thinking_mode":
                default_thinking = step[1]
        self.models = models
        self.default_thinking = default_thinking
        # json_object needs the word "json" in the messages; bodies add it unless faulty
        self.json_hint = True
        self.upper_bound = upper_bound(options)

    def chance(self, percent: int) -> bool:
        return chance(self.draw, percent)

    def fault(self, kind: str, percent: int = 50) -> bool:
        return kind in self.faults and self.chance(percent)

    def pick(self, values: list) -> Any:
        return self.draw(st.sampled_from(values))

    def pick_faulty(self, kind: str, valid: list, invalid: list, percent: int = 60) -> Any:
        if self.fault(kind, percent):
            return self.pick(invalid)
        return self.pick(valid)


# ---------------------------------------------------------------------------------------------
# JSON schemas

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


# ---------------------------------------------------------------------------------------------
# images

PNG_HEADER = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
ODD_BASE64 = ["@@", "iVBO Rw0K\nGgo=", "-_-_", "", "====", PNG_HEADER + "="]


def base64_payload(ctx: Ctx) -> str:
    data = base64.b64encode(ctx.draw(st.binary(max_size=12))).decode() or PNG_HEADER
    if ctx.chance(5):
        return data.rstrip("=") or "QQ"  # unpadded: accepted or not, both must agree
    return data


def image_spec(ctx: Ctx) -> dict:
    kinds = ["data", "http", "https"]
    if ctx.fault("image", 70):
        kinds = ["bad_b64", "bad_mime", "percent", "ftp", "garbage", "file_id", "odd_b64"]
    kind = ctx.pick(kinds)
    spec: dict[str, Any] = {"kind": kind}
    if kind in ("data", "bad_b64", "odd_b64"):
        spec["mime"] = ctx.pick(["image/png", "image/jpeg", "image/gif", "image/webp"])
        spec["data"] = {"data": base64_payload(ctx), "bad_b64": "@@"}.get(kind) or ctx.pick(
            ODD_BASE64
        )
    elif kind == "bad_mime":
        spec["mime"] = ctx.pick(["text/plain", "application/pdf", "image/bmp"])
        spec["data"] = "aGk="
    if ctx.chance(50):
        spec["detail"] = ctx.pick_faulty(
            "image", ["low", "high", "auto", "original"], ["weird"], 20
        )
    return spec


def image_url_of(spec: dict) -> str:
    kind = spec["kind"]
    if "data" in spec:
        return f"data:{spec['mime']};base64,{spec['data']}"
    return {
        "http": "http://example.com/a.png",
        "https": "https://example.com/日本/a.png?x=1&y=%20",
        "percent": "data:image/png,abc%20",
        "ftp": "ftp://example.com/a.png",
        "garbage": "notaurl",
        "file_id": "file-abc",
    }[kind]


# ---------------------------------------------------------------------------------------------
# abstract conversation script


def user_parts(ctx: Ctx, images: bool = True) -> list[tuple]:
    """("text", s) / ("image", spec) / ("file", variant) parts of a user-side message."""
    parts = []
    for _ in range(ctx.draw(st.integers(1, 3))):
        if images and ctx.chance(20):
            parts.append(("image", image_spec(ctx)))
        elif images and ctx.chance(3):
            parts.append(("file", "other"))
        else:
            parts.append(("text", ctx.draw(texts(4))))
    return parts


def conversation_script(ctx: Ctx, tool_names: list[str], prefix: bool = False) -> list[dict]:
    """Turns of a conversation; `prefix`: the last assistant may be a prefix continuation."""
    draw = ctx.draw
    turns: list[dict] = []
    if ctx.chance(40):
        turns.append({"kind": "system", "parts": user_parts(ctx, images=False)})
    rounds = draw(st.integers(1, 3))
    counter = [0]

    def call_id() -> str:
        counter[0] += 1
        return ctx.pick(["call_", "toolu_", "c", "日"]) + str(counter[0])

    def assistant(final: bool) -> dict:
        calls = []
        if not final and tool_names:
            for _ in range(draw(st.integers(1, 3))):
                calls.append({"id": call_id(), "name": ctx.pick(tool_names), "args": None})
        reasoning = ctx.pick(["text", "none", "empty"])
        return {
            "kind": "assistant",
            "content": draw(texts(4)) if final or ctx.chance(50) else "",
            "reasoning": {"text": draw(texts(3)), "none": None, "empty": ""}[reasoning],
            "calls": calls,
            "prefix": False,
        }

    def results(step: dict) -> dict:
        order = list(step["calls"])
        if len(order) > 1 and ctx.chance(20):
            order.reverse()
        return {
            "kind": "results",
            "results": [
                {"id": c["id"], "name": c["name"], "parts": user_parts(ctx)} for c in order
            ],
        }

    for index in range(rounds):
        last = index == rounds - 1
        turns.append({"kind": "user", "parts": user_parts(ctx)})
        if ctx.chance(10):
            turns.append({"kind": "reminder", "text": draw(texts(3))})
        if ctx.chance(7):
            turns.append({"kind": "system", "parts": user_parts(ctx, images=False), "mid": True})
        if not last:
            for _ in range(draw(st.integers(0, 2))):
                step = assistant(final=False)
                if not step["calls"]:
                    break
                turns.append(step)
                turns.append(results(step))
            turns.append(assistant(final=True))
            continue
        ending = ctx.pick(["user", "toolloop", "assistant", "toolloop", "prefix"])
        if ending == "toolloop" and tool_names:
            for _ in range(draw(st.integers(1, 2))):
                step = assistant(final=False)
                turns.append(step)
                turns.append(results(step))
        elif ending in ("assistant", "prefix"):
            step = assistant(final=True)
            step["prefix"] = ending == "prefix" and prefix
            if step["prefix"] and ctx.chance(50):
                step["content"] = ""
            turns.append(step)
    for turn in turns:
        for call in turn.get("calls", []):
            call["args"] = draw(argument_strings())
    if "history" in ctx.faults:
        break_history(ctx, turns)
    return turns


def break_history(ctx: Ctx, turns: list[dict]) -> None:
    """Make the tool history inconsistent (the fault "history")."""
    result_turns = [t for t in turns if t["kind"] == "results"]
    kind = ctx.pick(["drop_result", "orphan", "duplicate", "swap_id", "assistant_prefix"])
    if kind == "drop_result" and result_turns:
        turn = ctx.pick(result_turns)
        turn["results"].pop()
        if not turn["results"]:
            turns.remove(turn)
    elif kind == "orphan" or not result_turns:
        position = ctx.draw(st.integers(0, len(turns)))
        turns.insert(
            position,
            {
                "kind": "results",
                "results": [{"id": "orphan", "name": "f", "parts": [("text", "r")]}],
            },
        )
    elif kind == "duplicate":
        turn = ctx.pick(result_turns)
        turn["results"].append(dict(turn["results"][0]))
    elif kind == "swap_id":
        ctx.pick(result_turns)["results"][0]["id"] = "other"
    else:
        assistants = [t for t in turns if t["kind"] == "assistant"]
        if assistants:
            ctx.pick(assistants)["prefix"] = True


# ---------------------------------------------------------------------------------------------
# options shared by the protocols


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


# ---------------------------------------------------------------------------------------------
# Chat Completions


def chat_part(ctx: Ctx, part: tuple) -> dict:
    if part[0] == "text":
        return {"type": "text", "text": part[1]}
    if part[0] == "image":
        spec = part[1]
        if ctx.fault("file", 50):
            return {"type": "file", "file_data": image_url_of(spec)}
        image_url: dict[str, Any] = {"url": image_url_of(spec)}
        if "detail" in spec:
            image_url["detail"] = spec["detail"]
        return {"type": "image_url", "image_url": image_url}
    if ctx.fault("file", 80):
        return ctx.pick(
            [
                {"type": "file", "file_id": "file-1"},
                {"type": "file", "file": {"file_id": "file-1"}},
                {"type": "file", "file_data": "xx"},
                {"type": "file", "file_data": "data:application/pdf;base64,aGk="},
            ]
        )
    return {"type": "file", "file_data": f"data:image/png;base64,{PNG_HEADER}"}


def chat_content(ctx: Ctx, parts: list[tuple]) -> Any:
    if len(parts) == 1 and parts[0][0] == "text" and not ctx.chance(30):
        return parts[0][1]
    return [chat_part(ctx, p) for p in parts]


def chat_messages(ctx: Ctx, script: list[dict]) -> list[dict]:
    messages: list[dict] = []
    for turn in script:
        kind = turn["kind"]
        if kind == "system":
            role = "developer" if ctx.fault("role", 60) else "system"
            messages.append({"role": role, "content": chat_content(ctx, turn["parts"])})
        elif kind == "user":
            message: dict[str, Any] = {"role": "user", "content": chat_content(ctx, turn["parts"])}
            if ctx.chance(10):
                message["name"] = "alice"
            messages.append(message)
        elif kind == "reminder":
            messages.append({"role": "latest_reminder", "content": turn["text"]})
        elif kind == "assistant":
            message = {"role": "assistant"}
            content = turn["content"]
            if turn["calls"] and content == "" and ctx.chance(50):
                message["content"] = None
            elif ctx.chance(20):
                message["content"] = [{"type": "text", "text": content}]
            else:
                message["content"] = content
            if turn["reasoning"] is not None or ctx.chance(20):
                message["reasoning_content"] = turn["reasoning"]
            if turn["calls"]:
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["args"]},
                    }
                    for c in turn["calls"]
                ]
            if turn["prefix"] or ctx.chance(10):
                message["prefix"] = turn["prefix"]
            messages.append(message)
        elif kind == "results":
            for result in turn["results"]:
                content = chat_content(ctx, result["parts"])
                messages.append({"role": "tool", "tool_call_id": result["id"], "content": content})
    if ctx.fault("prefix", 80) and messages:
        target = ctx.pick(messages)
        target["prefix"] = True
    return messages


def chat_tool(tool: dict) -> dict:
    function: dict[str, Any] = {"name": tool["name"]}
    if "description" in tool:
        function["description"] = tool["description"]
    if "parameters" in tool:
        function["parameters"] = tool["parameters"]
    if tool["strict"] is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def chat_response_format(spec: dict) -> dict:
    if spec["type"] == "regex":
        return {"type": "regex", "regex": spec["regex"]}
    if spec["type"] != "json_schema":
        return {"type": spec["type"]}
    inner = {k: v for k, v in spec.items() if k != "type"}
    return {"type": "json_schema", "json_schema": inner}


def chat_body(ctx: Ctx) -> dict:
    draw = ctx.draw
    tools = tool_specs(ctx) if ctx.chance(60) else []
    names = [t["name"] for t in tools]
    # a prefix continuation is a 400 with tools ("Function call should not be used with prefix")
    script = conversation_script(ctx, names, prefix=not tools or "prefix" in ctx.faults)
    has_prefix = any(t.get("prefix") for t in script)
    body: dict[str, Any] = {"model": model_name(ctx), "messages": chat_messages(ctx, script)}
    switch = effort = None
    if ctx.chance(30):
        switch = ctx.pick_faulty(
            "enum", ["enabled", "disabled", "adaptive", "disabled"], ["auto", "off"]
        )
        body["thinking"] = {"type": switch}
    if ctx.chance(30):
        effort = ctx.pick_faulty(
            "enum",
            ["high", "none", "none", "minimal", "low", "medium", "xhigh", "ultra", "max"],
            ["bogus", "HIGH"],
        )
        body["reasoning_effort"] = effort
    thinking_off = thinking_is_off(ctx, switch, effort)
    if tools:
        body["tools"] = [chat_tool(t) for t in tools]
    choice = tool_choice_mode(ctx, thinking_off, names)
    if choice is not None:
        body["tool_choice"] = (
            {"type": "function", "function": {"name": choice[1]}}
            if choice[0] == "named"
            else choice[0]
        )
    sampling_options(ctx, body)
    if ctx.chance(25):
        body["max_tokens"] = max_token_value(ctx)
    if ctx.chance(15):
        # deviation 1: honoured by deepring_recipe, ignored by the official; always within the
        # bounds, which are at least 4096
        body["max_completion_tokens"] = draw(st.integers(1, 4096))
    if ctx.chance(10) or "n" in ctx.faults:
        body["n"] = ctx.pick_faulty("n", [1], [2, 0])
    logprobs = ctx.chance(20)
    if logprobs or ctx.chance(10):
        body["logprobs"] = logprobs
    if (logprobs and ctx.chance(50)) or "logprobs" in ctx.faults:
        body["top_logprobs"] = ctx.pick_faulty("logprobs", [0, 1, 5, 20], [21, -1])
    if ctx.chance(10) or "seed" in ctx.faults:
        body["seed"] = ctx.pick_faulty("seed", [7, 0, 2**63 - 1], [2**63, 2**64 - 1, -1])
    if ctx.chance(20) or "stop" in ctx.faults:
        body["stop"] = stop_value(ctx, allow_string=True)
    if ctx.chance(10) or "penalty" in ctx.faults:
        body["frequency_penalty"] = ctx.pick_faulty("penalty", [0, -2, 2, 1.5], [2.5, -3])
    if ctx.chance(10):
        body["presence_penalty"] = ctx.pick([0, 1, -1])
        body["logit_bias"] = {"50256": -100}
        body["parallel_tool_calls"] = ctx.pick([True, False])
    stream = ctx.chance(30)
    if stream or ctx.chance(10):
        body["stream"] = stream
    if (stream and ctx.chance(30)) or ctx.fault("stream_options"):
        body["stream_options"] = {"include_usage": ctx.pick([True, False])}
    spec = response_format_spec(ctx, tools) if ctx.chance(30) else None
    if spec is not None and spec["type"] == "json_object" and has_prefix:
        spec = None if "prefix" not in ctx.faults else spec  # json_object + prefix is a 400
    if spec is not None:
        body["response_format"] = chat_response_format(spec)
        if spec["type"] == "json_object" and ctx.json_hint:
            body["messages"].insert(0, {"role": "system", "content": "Reply in JSON."})
    if ctx.chance(10):
        body["user"] = "user-1"
        body["unknown_field"] = {"x": [1]}
    return body


# ---------------------------------------------------------------------------------------------
# Responses


def responses_part(ctx: Ctx, part: tuple, text_type: str) -> dict:
    if part[0] == "text":
        return {"type": text_type, "text": part[1]}
    if part[0] == "image":
        spec = part[1]
        out: dict[str, Any] = {"type": "input_image"}
        if spec["kind"] == "file_id":
            out["file_id"] = "file-1"
        else:
            out["image_url"] = image_url_of(spec)
        if "detail" in spec:
            out["detail"] = spec["detail"]
        return out
    if ctx.fault("image", 50):
        return {"type": "input_image"}
    return ctx.pick(
        [
            {"type": "input_file", "file_id": "file-1"},
            {"type": "input_file", "file_data": "aGk=", "filename": "a.txt"},
        ]
    )


def responses_content(ctx: Ctx, parts: list[tuple], role: str) -> Any:
    if len(parts) == 1 and parts[0][0] == "text" and not ctx.chance(40):
        return parts[0][1]
    text_type = "output_text" if role == "assistant" and ctx.chance(80) else "input_text"
    return [responses_part(ctx, p, text_type) for p in parts]


def responses_items(ctx: Ctx, script: list[dict], custom_names: set[str]) -> list[dict]:
    items: list[dict] = []
    for turn in script:
        kind = turn["kind"]
        if kind in ("system", "user", "reminder"):
            if kind == "reminder":
                role, parts = "developer", [("text", turn["text"])]
            elif kind == "system":
                role, parts = ctx.pick(["system", "developer"]), turn["parts"]
            else:
                role, parts = "user", turn["parts"]
            item = {"role": role, "content": responses_content(ctx, parts, role)}
            if ctx.chance(30):
                item["type"] = "message"
            items.append(item)
            if kind == "user" and ctx.chance(4):
                items.append(
                    ctx.pick(
                        [
                            {"type": "item_reference", "id": "msg_1"},
                            {"type": "apply_patch_call", "call_id": "p", "operation": {}},
                        ]
                    )
                )
        elif kind == "assistant":
            if turn["reasoning"] is not None:
                reasoning: dict[str, Any] = {"type": "reasoning", "summary": []}
                if ctx.chance(30):
                    reasoning["summary"] = [{"type": "summary_text", "text": "ignored"}]
                if ctx.chance(30):
                    reasoning["id"] = "rs_1"
                if turn["reasoning"] or ctx.chance(50):
                    reasoning["content"] = [{"type": "reasoning_text", "text": turn["reasoning"]}]
                if ctx.chance(10):
                    reasoning["encrypted_content"] = "opaque"
                items.append(reasoning)
            if turn["content"] or not turn["calls"]:
                content = responses_content(ctx, [("text", turn["content"])], "assistant")
                items.append({"role": "assistant", "content": content})
            for call in turn["calls"]:
                if call["name"] in custom_names:
                    items.append(
                        {
                            "type": "custom_tool_call",
                            "call_id": call["id"],
                            "name": call["name"],
                            "input": ctx.draw(texts(3)),
                        }
                    )
                    continue
                item = {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": call["args"],
                }
                if "::" in call["name"]:
                    namespace, local = call["name"].split("::", 1)
                    item["name"], item["namespace"] = local, namespace
                items.append(item)
        elif kind == "results":
            for result in turn["results"]:
                output = responses_content(ctx, result["parts"], "user")
                kind_ = (
                    "custom_tool_call_output"
                    if result["name"] in custom_names
                    else "function_call_output"
                )
                items.append({"type": kind_, "call_id": result["id"], "output": output})
    return items


def responses_tool(tool: dict) -> dict:
    out: dict[str, Any] = {"type": "function", "name": tool["name"]}
    for key in ("description", "parameters"):
        if key in tool:
            out[key] = tool[key]
    if tool["strict"] is not None:
        out["strict"] = tool["strict"]
    if tool["defer_loading"]:
        out["defer_loading"] = True
    return out


SERVER_TOOLS_RESPONSES = [
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["v"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "apply_patch"},
]


def responses_body(ctx: Ctx) -> dict:
    tools = tool_specs(ctx) if ctx.chance(60) else []
    declared: list[dict] = [responses_tool(t) for t in tools]
    call_names = [t["name"] for t in tools]
    custom_names: set[str] = set()
    any_strict = any(t["strict"] for t in tools)
    if ctx.chance(20) and (not any_strict or "strict_mix" in ctx.faults):
        declared.append({"type": "custom", "name": "apply_patch", "description": "ignored"})
        call_names.append("apply_patch")
        custom_names.add("apply_patch")
    if ctx.fault("custom_tool", 80):
        declared.append({"type": "custom", "name": ctx.pick(["x", "apply-patch"])})
    if ctx.chance(20):
        strictness = tools[0]["strict"] if tools else "draw"
        inner = [responses_tool(t) for t in tool_specs(ctx, max_tools=2, strictness=strictness)]
        namespace = ctx.pick(["crm", "ns", "a-b"])
        description = ctx.draw(short_texts)
        declared.append(
            {"type": "namespace", "name": namespace, "description": description, "tools": inner}
        )
        call_names += [f"{namespace}::{t['name']}" for t in inner]
    if ctx.chance(15) or ctx.fault("server_tool", 60):
        declared.append(ctx.pick([*SERVER_TOOLS_RESPONSES, {"type": "computer_use_preview"}]))
    script = conversation_script(ctx, call_names)
    body: dict[str, Any] = {"model": model_name(ctx)}
    shape = ctx.pick(["items", "items", "string", "instructions_only"])
    if ctx.fault("input", 80):
        shape = ctx.pick(["empty", "missing"])
    if shape == "items":
        body["input"] = responses_items(ctx, script, custom_names)
    elif shape == "string":
        body["input"] = ctx.draw(short_texts)
    elif shape == "empty":
        body["input"] = []
    if shape == "instructions_only" or ctx.chance(30):
        body["instructions"] = ctx.draw(texts(3, min_size=1).filter(bool))
    if declared:
        body["tools"] = declared
    effort = None
    if ctx.chance(50):
        reasoning: dict[str, Any] = {}
        if ctx.chance(80):
            effort = ctx.pick_faulty(
                "enum",
                ["high", "none", "none", "minimal", "low", "medium", "xhigh", "max", None],
                ["ultra", "bogus"],
            )
            reasoning["effort"] = effort
        if ctx.chance(20):
            reasoning["summary"] = ctx.pick(["auto", "concise", "detailed", None])
        body["reasoning"] = reasoning
    choice = tool_choice_mode(ctx, thinking_is_off(ctx, None, effort), call_names)
    if choice is not None:
        body["tool_choice"] = (
            {"type": "function", "name": choice[1]} if choice[0] == "named" else choice[0]
        )
    if ctx.fault("tool_choice_shape", 80):
        body["tool_choice"] = ctx.pick(
            [
                {"type": "allowed_tools", "mode": "auto", "tools": []},
                {"type": "custom", "name": "apply_patch"},
                {"type": "web_search"},
                "bogus",
                {"type": "function"},
            ]
        )
    sampling_options(ctx, body)
    if ctx.chance(25):
        body["max_output_tokens"] = max_token_value(ctx)
    if ctx.chance(10):
        body["top_logprobs"] = ctx.pick_faulty("enum", [0, 3, 20], [21, -1])
    if ctx.chance(35):
        text: dict[str, Any] = {}
        spec = response_format_spec(ctx, declared) if ctx.chance(85) else None
        if spec is not None:
            text["format"] = (
                {k: v for k, v in spec.items() if k != "regex"}
                if spec["type"] != "regex"
                else {"type": "text"}
            )
            if spec["type"] == "json_object" and ctx.json_hint:
                body["instructions"] = "Answer in json."
        if ctx.chance(20):
            text["verbosity"] = ctx.pick(["low", "medium", "high"])
        body["text"] = text
    stream = ctx.chance(30)
    if stream or ctx.chance(10):
        body["stream"] = stream
    if ctx.chance(10):
        body["user"] = ctx.pick(["u-1", "日本"])
    if ctx.chance(10):
        body.update(
            {
                "previous_response_id": "resp_0",
                "store": False,
                "background": False,
                "include": ["reasoning.encrypted_content"],
                "metadata": {"k": "v"},
                "parallel_tool_calls": True,
                "truncation": "disabled",
                "thinking": {"type": "disabled"},
            }
        )
    return body


# ---------------------------------------------------------------------------------------------
# Messages


def messages_image_block(spec: dict) -> dict:
    kind = spec["kind"]
    if "data" in spec:
        source = {"type": "base64", "media_type": spec["mime"], "data": spec["data"]}
    elif kind == "file_id":
        source = {"type": "file", "file_id": "file-1"}
    else:
        source = {"type": "url", "url": image_url_of(spec)}
    return {"type": "image", "source": source}


DOCUMENTS = [
    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "D"}},
    {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "aGk="},
    },
]
BAD_BLOCKS = [
    {"type": "redacted_thinking", "data": "x"},
    {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
    {"type": "web_search_tool_result", "tool_use_id": "s", "content": []},
    {"type": "search_result", "source": "s", "title": "t", "content": []},
]


def messages_blocks(ctx: Ctx, parts: list[tuple]) -> Any:
    if len(parts) == 1 and parts[0][0] == "text" and not ctx.chance(40):
        return parts[0][1]
    out = []
    for part in parts:
        if part[0] == "text":
            block: dict[str, Any] = {"type": "text", "text": part[1]}
            if ctx.chance(10):
                block["cache_control"] = {"type": "ephemeral"}
            out.append(block)
        elif part[0] == "image":
            out.append(messages_image_block(part[1]))
        else:
            out.append(ctx.pick(DOCUMENTS))
    if ctx.fault("block", 60):
        out.append(ctx.pick(BAD_BLOCKS))
    if ctx.fault("content", 40):
        return []
    return out


def _dict_safe(value: Any) -> bool:
    """Whether a value survives the Python-object body path (finite floats, ints within the
    JSON number range); other values raise OverflowError / ValueError at construction."""
    if isinstance(value, dict):
        return all(_dict_safe(v) for v in value.values())
    if isinstance(value, list):
        return all(_dict_safe(v) for v in value)
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**64
    return True


def messages_input_value(ctx: Ctx, args: str) -> Any:
    try:
        value = json.loads(args)
    except ValueError:
        return ctx.pick([{}, "notobj", [1, 2]])
    if not _dict_safe(value) and not ctx.fault("block", 80):
        return {}
    return value if isinstance(value, dict) or ctx.chance(50) else {}


def messages_turns(ctx: Ctx, script: list[dict], deferred: list[str]) -> tuple[Any, list]:
    system = None
    messages: list[dict] = []
    for index, turn in enumerate(script):
        kind = turn["kind"]
        if kind == "system" and index == 0:
            texts_ = [p[1] for p in turn["parts"] if p[0] == "text"] or [""]
            if ctx.chance(50):
                system = [{"type": "text", "text": t} for t in texts_]
            else:
                system = "\n\n".join(texts_)
        elif kind in ("system", "reminder"):
            if kind == "reminder":
                text = turn["text"]
            else:
                text = "".join(p[1] for p in turn["parts"] if p[0] == "text")
            blocks: list[dict] = [{"type": "text", "text": text or "sys"}]
            if deferred and ctx.chance(60):
                name = ctx.pick(deferred)
                if ctx.fault("tool_addition", 50):
                    name = "zz"
                blocks.append(
                    {"type": "tool_addition", "tool": {"type": "tool_reference", "name": name}}
                )
            messages.append({"role": "system", "content": blocks})
        elif kind == "user":
            content = messages_blocks(ctx, turn["parts"])
            if ctx.fault("tool_addition", 30) and deferred:
                content = [
                    {
                        "type": "tool_addition",
                        "tool": {"type": "tool_reference", "name": deferred[0]},
                    }
                ]
            previous = messages[-1] if messages else None
            if (
                previous is not None
                and previous["role"] == "user"
                and isinstance(previous["content"], list)
                and any(b.get("type") == "tool_result" for b in previous["content"])
                and isinstance(content, list)
                and ctx.chance(50)
            ):
                previous["content"].extend(content)  # text right after the tool results
            else:
                messages.append({"role": "user", "content": content})
        elif kind == "assistant":
            blocks = []
            if turn["reasoning"] is not None:
                blocks.append({"type": "thinking", "thinking": turn["reasoning"], "signature": "s"})
            if turn["content"] or not turn["calls"]:
                blocks.append({"type": "text", "text": turn["content"]})
            for call in turn["calls"]:
                value = messages_input_value(ctx, call["args"])
                blocks.append(
                    {"type": "tool_use", "id": call["id"], "name": call["name"], "input": value}
                )
            if len(blocks) == 1 and blocks[0]["type"] == "text" and ctx.chance(50):
                messages.append({"role": "assistant", "content": blocks[0]["text"]})
            else:
                messages.append({"role": "assistant", "content": blocks})
        elif kind == "results":
            blocks = []
            for result in turn["results"]:
                block: dict[str, Any] = {"type": "tool_result", "tool_use_id": result["id"]}
                if ctx.chance(80):
                    block["content"] = messages_blocks(ctx, result["parts"])
                if ctx.chance(20):
                    block["is_error"] = ctx.pick([True, False])
                blocks.append(block)
            messages.append({"role": "user", "content": blocks})
    return system, messages


def messages_tool(tool: dict) -> dict:
    out: dict[str, Any] = {"name": tool["name"]}
    if "description" in tool:
        out["description"] = tool["description"]
    if "parameters" in tool and tool["parameters"] is not None:
        out["input_schema"] = tool["parameters"]
    elif "schema" not in tool.get("faults", ()):
        out["input_schema"] = {"type": "object", "properties": {}}
    if tool["defer_loading"]:
        out["defer_loading"] = True
    if tool["strict"] is not None:
        out["strict"] = tool["strict"]
    return out


SERVER_TOOLS_MESSAGES = [
    {"type": "web_search_20250305", "name": "web_search"},
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250124", "name": "str_replace_editor"},
    {"type": "custom", "name": "c", "input_schema": {"type": "object"}},
]


def messages_body(ctx: Ctx) -> dict:
    tools = tool_specs(ctx) if ctx.chance(60) else []
    if tools and all(t["defer_loading"] for t in tools) and not ctx.fault("deferred", 80):
        tools[0]["defer_loading"] = False
    if ctx.fault("schema", 30) and tools:
        tools[0].pop("parameters", None)
        tools[0]["faults"] = ("schema",)
    declared = [messages_tool(t) for t in tools]
    names = [t["name"] for t in tools]
    deferred = [t["name"] for t in tools if t["defer_loading"]]
    web_search_dropped = ["messages_web_search", "Drop"] in ctx.options.get("with", []) or (
        ctx.options.get("ctor", {}).get("messages_web_search") == "Drop"
    )
    if (web_search_dropped and ctx.chance(20)) or ctx.fault("server_tool", 60):
        declared.append(ctx.pick(SERVER_TOOLS_MESSAGES))
    script = conversation_script(ctx, names)
    system, messages = messages_turns(ctx, script, deferred)
    if deferred and messages and ctx.chance(70):
        # a system message that brings a deferred tool in (rendered in place by V4.1)
        blocks = [
            {"type": "text", "text": ctx.draw(texts(2))},
            {"type": "tool_addition", "tool": {"type": "tool_reference", "name": deferred[-1]}},
        ]
        position = ctx.draw(st.integers(1, len(messages)))
        messages.insert(position, {"role": "system", "content": blocks})
    if ctx.fault("content", 40):
        messages = []
    body: dict[str, Any] = {"model": model_name(ctx), "messages": messages}
    if system is not None:
        body["system"] = system
    if ctx.chance(80):
        body["max_tokens"] = max_token_value(ctx)
    if declared:
        body["tools"] = declared
    switch = effort = None
    if ctx.chance(50):
        switch = ctx.pick_faulty("enum", ["enabled", "disabled", "adaptive", "disabled"], ["auto"])
        body["thinking"] = {"type": switch}
        if switch == "enabled" and ctx.chance(50):
            body["thinking"]["budget_tokens"] = 1024
    if ctx.chance(30):
        effort = ctx.pick_faulty(
            "enum", ["high", "none", "low", "medium", "xhigh", "max", "ultra"], ["bogus", "minimal"]
        )
        body["output_config"] = {"effort": effort}
    choice = tool_choice_mode(ctx, thinking_is_off(ctx, switch, effort), names)
    if choice is not None:
        if choice[0] == "named":
            body["tool_choice"] = {"type": "tool", "name": choice[1]}
        else:
            mapped = {"auto": "auto", "none": "none", "required": "any"}[choice[0]]
            body["tool_choice"] = {"type": mapped}
            if ctx.chance(20):
                body["tool_choice"]["disable_parallel_tool_use"] = True
    sampling_options(ctx, body)
    if ctx.chance(10):
        body["top_k"] = 5
    if ctx.chance(20) or "stop" in ctx.faults:
        body["stop_sequences"] = stop_value(ctx, allow_string=False)
    stream = ctx.chance(30)
    if stream or ctx.chance(10):
        body["stream"] = stream
    if ctx.chance(10):
        body.update(
            {
                "metadata": {"user_id": "u"},
                "service_tier": "auto",
                "container": "c",
                "mcp_servers": [],
                "output_format": {"type": "json_schema", "schema": {"type": "object"}},
            }
        )
    return body


# ---------------------------------------------------------------------------------------------
# generic mutation (fault "mutation")


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, sub in value.items():
            out += _paths(sub, (*prefix, key))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            out += _paths(sub, (*prefix, index))
    return out


REPLACEMENTS = ["x", None, 1, -1, 1.5, "", True, [], {}, [1], {"a": 1}, "auto", "none"]


def mutate(ctx: Ctx, body: dict) -> dict:
    """Replace the value at a random path by one of another kind, or delete a key."""
    # max_completion_tokens stays a valid integer: the official ignores the field, ours reads it
    # (deviation 1), so a wrongly typed value would be a construction error for ours only
    paths = [p for p in _paths(body) if p and p[0] != "max_completion_tokens"]
    if not paths:
        return body
    path = ctx.pick(paths)
    body = json.loads(json.dumps(body))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and ctx.chance(30):
        del parent[path[-1]]
    else:
        parent[path[-1]] = ctx.pick(REPLACEMENTS)
    return body


# ---------------------------------------------------------------------------------------------
# ConversionOptions specs

SPECIAL_OVERRIDES = {
    "thinking_start": "<THINK>",
    "thinking_end": "</THINK>",
    "dsml": "|DS|",
    "user": "<|U|>",
    "assistant": "<|A|>",
    "system": "<|S|>",
    "eos": "<|EOS|>",
    "bos": "<|BOS|>",
    "image": "<IMG>",
    "latest_reminder": "<|R|>",
}
# at least 4096, so that a generated max_completion_tokens (deviation 1) is always in range
BOUNDS = [393216, 4096, 8192, 65536, 500000]


@st.composite
def conversion_options(draw) -> dict:
    """A ConversionOptions spec: the defaults half of the time, else a mix of constructor
    keywords and `with_*` builder steps."""
    if not chance(draw, 50):
        return {}
    ctor: dict[str, Any] = {}
    steps: list[list] = []

    def setting(name: str, value: Any) -> None:
        if draw(st.booleans()):
            ctor[name] = value
        else:
            steps.append([name, value])

    if chance(draw, 40):
        setting("default_thinking_mode", draw(st.booleans()))
    if chance(draw, 30):
        setting("reasoning_content_behavior", draw(st.sampled_from(["FillEmpty", "Reject"])))
    if chance(draw, 20):
        setting("responses_web_search", draw(st.sampled_from(["Drop", "Reject"])))
    if chance(draw, 30):
        setting("messages_web_search", draw(st.sampled_from(["Reject", "Drop"])))
    if chance(draw, 20):
        setting("thinking_max_tokens_upper_bound", draw(st.sampled_from(BOUNDS)))
    if chance(draw, 20):
        setting("non_thinking_max_tokens_upper_bound", draw(st.sampled_from(BOUNDS)))
    if chance(draw, 10):
        steps.insert(0, ["model_versions_by_name", {"only-model": "DeepseekV41Flash"}])
    if chance(draw, 30):
        names = draw(st.lists(st.sampled_from(["my-alias", "DeepSeek-V4-Pro"]), max_size=2))
        for name in names:
            version = draw(st.sampled_from(["DeepseekV4Pro", "DeepseekV41Flash"]))
            steps.append(["model_alias", name, version])
    if chance(draw, 10):
        keys = draw(st.lists(st.sampled_from(sorted(SPECIAL_OVERRIDES)), min_size=1, unique=True))
        steps.append(["special_tokens", {k: SPECIAL_OVERRIDES[k] for k in keys}])
    return {"ctor": ctor, "with": steps}


def upper_bound(options: dict) -> int:
    bounds = [393216, 393216]
    for key, value in options.get("ctor", {}).items():
        if key == "thinking_max_tokens_upper_bound":
            bounds[0] = value
        elif key == "non_thinking_max_tokens_upper_bound":
            bounds[1] = value
    for step in options.get("with", []):
        if step[0] == "thinking_max_tokens_upper_bound":
            bounds[0] = step[1]
        elif step[0] == "non_thinking_max_tokens_upper_bound":
            bounds[1] = step[1]
    return min(bounds)


# ---------------------------------------------------------------------------------------------
# whole cases

BODIES = {"chat": chat_body, "responses": responses_body, "messages": messages_body}


@st.composite
def request_cases(draw, protocol: str) -> dict:
    options = draw(conversion_options())
    faults: set[str] = set()
    if chance(draw, 55):
        kinds = FAULTS["common"] + FAULTS[protocol]
        faults = set(draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=2)))
    ctx = Ctx(draw, protocol, faults, options)
    body: Any = BODIES[protocol](ctx)
    if "mutation" in faults:
        body = mutate(ctx, body)
    encoding = draw(st.sampled_from(["dict", "dict", "dict", "dict", "str", "bytes"]))
    if encoding != "dict":
        text = json.dumps(body, ensure_ascii=draw(st.booleans()))
        body = text if encoding == "str" else text.encode()
    return {"protocol": protocol, "body": body, "options": options, "faults": sorted(faults)}
