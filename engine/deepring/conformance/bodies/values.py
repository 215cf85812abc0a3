"""Text and JSON values: the fragments of request texts, tool-call arguments."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

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
