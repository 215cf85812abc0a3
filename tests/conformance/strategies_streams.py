"""Hypothesis strategies for streamed model output (issue 5).

`stream_cases(protocol)` draws a streaming scenario:

- a small request of the protocol whose conversion yields the parsing options under test
  (thinking on/off, tools with parse_tool_calls, required/named tool_choice that starts
  inside the tool-call block, json_object output parsing, stop sequences, Chat prefix
  continuations that start in ReasoningContinuation / ContentContinuation, V4 or V4.1 model,
  special-token overrides through ConversionOptions.with_special_tokens, Responses namespace
  and apply_patch tools, a Messages signature);
- backend details: whether `ready` is pushed, the final finish reason;
- the model output text: reasoning (with newlines, partial markers, multi-byte text and
  emoji), `</think>`, content (stop sequences, stray `</think>`, JSON fences or raw JSON),
  zero or more DSML tool-call blocks in the V4 (`<｜DSML｜tool_calls>` / `invoke` /
  `parameter`) or V4.1 (`<｜DSML｜ calls>` / ` invoke` / ` parameter`) spelling with
  parameters of every JSON type, `string="true"` / `"false"` / odd values, unknown tool
  names, text after the block, and truncation at any point;
- `chunking_plans()`: how the same output is pushed (whole, per character, random splits,
  one token id per push, random groups of token ids, one UTF-8 byte token per push);
  `materialise` turns a plan into the chunks `summary.build_chunks` pushes.

`token_soup_cases()` draws raw token-id sequences (partial UTF-8 tokens, special tokens,
ids the tokenizer does not know) for the decoder alone.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from deepring.conformance.bodies import CHARS, chance
from hypothesis import strategies as st

V4_TAGS = ("tool_calls", "invoke", "parameter")
V41_TAGS = (" calls", " invoke", " parameter")

STREAM_FRAGMENTS = [
    "Hello",
    " world",
    "\n",
    "\n\n",
    " ",
    "Let me think.",
    "</th",
    "</",
    "<",
    "<｜",
    "<｜DSML",
    "｜DSML｜",
    "<think>",
    "```",
    "```json",
    "{",
    "}",
    '"',
    "\\",
    "日本語",
    "中文",
    "é",
    "😀",
    "👨\u200d👩\u200d👧",
    "\u2028",
    "\t",
    "json",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "ST",
    "END",
]
STOP_STRINGS = ["STOP", "\n\n\n", "</answer>", "。", "😀x", "END", "ab"]
TOOL_NAMES = ["get_weather", "search", "f"]


def stream_texts(max_fragments: int = 6) -> st.SearchStrategy[str]:
    piece = st.one_of(st.sampled_from(STREAM_FRAGMENTS), st.text(alphabet=CHARS, max_size=6))
    return st.lists(piece, max_size=max_fragments).map("".join)


# ---------------------------------------------------------------------------------------------
# requests producing the parsing options


def _tool(name: str) -> dict:
    return {
        "name": name,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    }


@st.composite
def stream_requests(draw, protocol: str) -> dict:
    """Request body + options + the facts the output generator needs."""
    model = draw(st.sampled_from(["DeepSeek-V4.1-Flash", "DeepSeek-V4-Pro"]))
    thinking = draw(st.booleans())
    tools = draw(st.sampled_from([[], TOOL_NAMES[:2], TOOL_NAMES]))
    choice = "auto"
    if tools and not thinking:
        choice = draw(st.sampled_from(["auto", "required", "named", "none"]))
    json_mode = chance(draw, 20) and not (protocol == "responses" and tools)
    stops = draw(st.lists(st.sampled_from(STOP_STRINGS), max_size=2, unique=True))
    overrides: dict[str, str] = {}
    if chance(draw, 15):
        overrides = draw(
            st.sampled_from(
                [
                    {"thinking_end": "</THINK>"},
                    {"dsml": "|DS|"},
                    {"thinking_end": "</THINK>", "dsml": "|DS|", "eos": "<EOS>"},
                ]
            )
        )
    user = "hi" + (" json" if json_mode else "")
    prefix = None
    if protocol == "chat" and not tools and not json_mode and chance(draw, 35):
        prefix = draw(st.sampled_from(["reasoning", "content"]))
    extras: dict[str, Any] = {}
    if protocol == "chat":
        messages: list[dict] = [{"role": "user", "content": user}]
        if prefix == "reasoning":
            messages.append(
                {"role": "assistant", "content": "", "reasoning_content": "part", "prefix": True}
            )
        elif prefix == "content":
            messages.append(
                {"role": "assistant", "content": "So", "reasoning_content": "r", "prefix": True}
            )
        body: dict[str, Any] = {"model": model, "messages": messages}
        body["thinking"] = {"type": "enabled" if thinking else "disabled"}
        if tools:
            body["tools"] = [{"type": "function", "function": _tool(n)} for n in tools]
            if choice == "named":
                body["tool_choice"] = {"type": "function", "function": {"name": tools[0]}}
            else:
                body["tool_choice"] = choice
        if json_mode:
            body["response_format"] = {"type": "json_object"}
        if stops:
            body["stop"] = stops
        if chance(draw, 30):
            body["stream"] = True
    elif protocol == "responses":
        body = {"model": model, "input": user}
        body["reasoning"] = {"effort": draw(st.sampled_from(["high", "low", "max"]))}
        if not thinking:
            body["reasoning"] = {"effort": "none"}
        declared: list[dict] = [{"type": "function", **_tool(n)} for n in tools]
        if tools and chance(draw, 50):
            declared.append({"type": "custom", "name": "apply_patch"})
            tools = ["apply_patch", *tools]
        if tools and chance(draw, 40):
            declared.append(
                {
                    "type": "namespace",
                    "name": "crm",
                    "description": "CRM",
                    "tools": [{"type": "function", **_tool("lookup")}],
                }
            )
            tools = [*tools, "crm::lookup"]
        if declared:
            body["tools"] = declared
            if choice == "named":
                body["tool_choice"] = {"type": "function", "name": tools[0]}
            else:
                body["tool_choice"] = choice
        if json_mode:
            body["text"] = {"format": {"type": "json_object"}}
        if chance(draw, 30):
            body.update(instructions="Be brief.", temperature=0.5, max_output_tokens=100, user="u")
        extras["stop_override"] = stops or None
    else:
        body = {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": user}]}
        body["thinking"] = {"type": "enabled" if thinking else "disabled"}
        if tools:
            body["tools"] = [{"name": n, "input_schema": _tool(n)["parameters"]} for n in tools]
            if choice == "named":
                body["tool_choice"] = {"type": "tool", "name": tools[0]}
            else:
                body["tool_choice"] = {"type": {"required": "any"}.get(choice, choice)}
        if stops:
            body["stop_sequences"] = stops
        if chance(draw, 30):
            extras["signature"] = "sig-1"
    if json_mode and protocol == "messages":
        json_mode = False  # Messages has no json_object mode
    options: dict = {}
    if overrides:
        options = {"ctor": {}, "with": [["special_tokens", overrides]]}
    stage = None
    if thinking:
        stage = {"reasoning": "ReasoningContinuation", "content": "ContentContinuation"}.get(
            prefix or "", "ReasoningStart"
        )
    required = choice in ("required", "named") and bool(tools)
    return {
        "protocol": protocol,
        "body": body,
        "options": options,
        "facts": {
            "stage": stage,
            "tools": tools if choice != "none" else [],
            "required": required,
            "json": json_mode,
            "stops": stops,
            "think_end": overrides.get("thinking_end", "</think>"),
            "dsml": overrides.get("dsml", "｜DSML｜"),
            "v41": model == "DeepSeek-V4.1-Flash",
        },
        **extras,
    }


# ---------------------------------------------------------------------------------------------
# model output


def json_value_texts() -> st.SearchStrategy[str]:
    """string="false" parameter values: JSON of every type, or raw text."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**20), 10**20),
        st.sampled_from([0.5, -0.0, 1e-7, 1.5e300, 3.0]),
        st.text(alphabet=CHARS, max_size=6),
    )
    values = st.recursive(
        leaves,
        lambda c: st.one_of(
            st.lists(c, max_size=3),
            st.dictionaries(st.text(alphabet=CHARS, max_size=4), c, max_size=3),
        ),
        max_leaves=6,
    )
    return st.one_of(
        values.map(lambda v: json.dumps(v, ensure_ascii=False)),
        values.map(lambda v: json.dumps(v, separators=(",", ":"))),
        st.sampled_from(["not json", "[1, 2", "", "  42  ", '{"a": </']),
    )


@st.composite
def parameter_texts(draw, dsml: str, tag: str) -> str:
    name = draw(st.sampled_from(["city", "days", "q", "日本", "with space", 'a"b', ""]))
    roll = draw(st.integers(0, 9))
    if roll < 5:
        flag = "true"
        value = draw(stream_texts(4))
    elif roll < 9:
        flag = "false"
        value = draw(json_value_texts())
    else:
        flag = draw(st.sampled_from(["maybe", "TRUE", ""]))
        value = draw(stream_texts(2))
    return f'<{dsml}{tag} name="{name}" string="{flag}">{value}</{dsml}{tag}>\n'


@st.composite
def invoke_texts(draw, dsml: str, tags: tuple[str, str, str], names: list[str]) -> str:
    name = draw(st.sampled_from([*names, "unknown_tool", "日本"] if names else ["f"]))
    params = "".join(draw(st.lists(parameter_texts(dsml, tags[2]), max_size=3)))
    return f'<{dsml}{tags[1]} name="{name}">\n{params}</{dsml}{tags[1]}>\n'


@st.composite
def tool_blocks(draw, facts: dict, opened: bool) -> str:
    """A DSML block; `opened`: the prompt already opened it (required tool choice)."""
    dsml = facts["dsml"]
    if chance(draw, 10):
        dsml = "｜DSML｜" if dsml != "｜DSML｜" else dsml  # default spelling under an override
    tags = V41_TAGS if draw(st.booleans()) else V4_TAGS
    names = list(facts["tools"]) or list(TOOL_NAMES)
    invokes = "".join(draw(st.lists(invoke_texts(dsml, tags, names), min_size=1, max_size=3)))
    head = "" if opened else draw(st.sampled_from(["\n\n", "", "\n"])) + f"<{dsml}{tags[0]}>\n"
    return head + invokes + f"</{dsml}{tags[0]}>"


@st.composite
def content_texts(draw, facts: dict) -> str:
    pieces = [draw(stream_texts(5))]
    if facts["stops"] and chance(draw, 50):
        pieces.insert(draw(st.integers(0, 1)), draw(st.sampled_from(facts["stops"])))
    if chance(draw, 15):
        pieces.append(facts["think_end"])  # a stray end of thinking in content
    if facts["json"]:
        value = json.dumps({"a": [1, "x"], "b": None}, ensure_ascii=False)
        shape = draw(st.sampled_from(["fenced", "bare_fence", "raw", "none"]))
        if shape == "fenced":
            pieces.append(f"```json\n{value}\n```")
        elif shape == "bare_fence":
            pieces.append(f"```\n{value}\n```")
        elif shape == "raw":
            pieces.append(value)
        pieces.append(draw(stream_texts(2)))
    return "".join(pieces)


@st.composite
def model_outputs(draw, facts: dict) -> str:
    parts: list[str] = []
    if facts["required"]:
        parts.append(draw(tool_blocks(facts, opened=True)))
        if chance(draw, 30):
            parts.append(draw(stream_texts(2)))
    else:
        if facts["stage"] in ("ReasoningStart", "ReasoningContinuation"):
            parts.append(draw(st.sampled_from(["", "\n", "\n\n"])))
            reasoning = draw(stream_texts(6))
            if facts["stops"] and chance(draw, 30):
                reasoning += draw(st.sampled_from(facts["stops"]))  # ignored in reasoning
            parts.append(reasoning)
            end = draw(st.sampled_from(["think_end", "think_end", "think_end", "open", "tools"]))
            if end == "think_end":
                newlines = draw(st.sampled_from(["", "\n", "\n\n"]))
                parts.append(newlines + facts["think_end"] + draw(st.sampled_from(["", "\n\n"])))
            elif end == "tools" and facts["tools"]:
                parts.append(draw(tool_blocks(facts, opened=False)))
        if not parts or not parts[-1].endswith(">") or parts[-1].endswith(facts["think_end"]):
            parts.append(draw(content_texts(facts)))
            if facts["tools"] or chance(draw, 15):
                for _ in range(draw(st.integers(0, 2))):
                    parts.append(draw(tool_blocks(facts, opened=False)))
                if chance(draw, 30):
                    parts.append(draw(stream_texts(2)))  # dropped: content after the block
    if chance(draw, 10):
        parts.append("<｜end▁of▁sentence｜>")
    text = "".join(parts)
    if text and chance(draw, 20):
        text = text[: draw(st.integers(0, len(text)))]  # truncated anywhere
    return text


@st.composite
def stream_cases(draw, protocol: str) -> dict:
    case = draw(stream_requests(protocol))
    case["ready"] = not chance(draw, 20)
    case["finish"] = draw(st.sampled_from(["Stop", "Stop", "Length", "ContentFilter"]))
    case["output"] = draw(model_outputs(case["facts"]))
    return case


# ---------------------------------------------------------------------------------------------
# chunkings


@st.composite
def chunking_plans(draw) -> list[dict]:
    """The chunkings each output is pushed with; "whole" always comes first."""
    plans: list[dict] = [{"kind": "whole"}, {"kind": "chars"}]
    for _ in range(draw(st.integers(1, 2))):
        cuts = draw(st.lists(st.floats(0, 1, allow_nan=False), max_size=8))
        plans.append({"kind": "random", "cuts": sorted(cuts)})
    plans.append({"kind": "tokens"})
    cuts = draw(st.lists(st.floats(0, 1, allow_nan=False), max_size=6))
    plans.append({"kind": "token_groups", "cuts": sorted(cuts), "logprobs": chance(draw, 30)})
    plans.append({"kind": "bytes"})
    return plans


def _split(seq: list | str, cuts: list[float]) -> list:
    points = sorted({int(c * len(seq)) for c in cuts} | {0, len(seq)})
    return [seq[a:b] for a, b in itertools.pairwise(points) if b > a]


def logprobs_for(ids: list[int]) -> list:
    """Deterministic fake log probabilities: (logprob, [(id, logprob), ...]) per token."""
    return [(-(i % 7) / 4, [[i, -(i % 7) / 4], [(i + 1) % 128000, -2.5]]) for i in ids]


def materialise(plan: dict, text: str, token_ids: list[int], byte_ids: list[int]) -> dict:
    """The chunking of `text` described by `plan`, in `summary.build_chunks` form. Text chunks
    carry their length in code points as token count, so every text chunking of one output
    accounts for the same number of tokens."""
    kind = plan["kind"]
    if kind == "whole":
        return {"mode": "text", "pieces": [[text, len(text)]] if text else []}
    if kind == "chars":
        return {"mode": "text", "pieces": [[c, 1] for c in text]}
    if kind == "random":
        return {"mode": "text", "pieces": [[p, len(p)] for p in _split(text, plan["cuts"])]}
    if kind == "tokens":
        return {"mode": "tokens", "groups": [[[i], None] for i in token_ids]}
    if kind == "token_groups":
        groups = _split(token_ids, plan["cuts"])
        with_lp = plan.get("logprobs", False)
        return {
            "mode": "tokens",
            "groups": [[g, logprobs_for(g) if with_lp else None] for g in groups],
        }
    if kind == "bytes":
        return {"mode": "tokens", "groups": [[[i], None] for i in byte_ids]}
    if kind == "id_groups":
        return {"mode": "tokens", "groups": [[g, None] for g in _split(token_ids, plan["cuts"])]}
    raise ValueError(kind)


def usage_class(plan: dict) -> str:
    """Chunkings of one class account for the same tokens (text vs ids vs byte ids); logprobs
    make another class for the events that carry them."""
    kind = plan["kind"]
    if kind in ("whole", "chars", "random"):
        return "text"
    if kind == "bytes":
        return "bytes"
    return "tokens+logprobs" if plan.get("logprobs") else "tokens"


# ---------------------------------------------------------------------------------------------
# raw token ids for the decoder

SOUP_IDS = [
    3574,  # lead bytes of a multi-byte character
    102,
    225,
    23166,
    6439,
    128822,  # </think>
    128821,  # <think>
    128825,  # ｜DSML｜
    1,  # EOS
    0,  # BOS
    129280,  # <｜System｜> (fixture)
    999_999_999,  # unknown ids are ignored
    129_999,
    33,
    271,
]


@st.composite
def token_soup_cases(draw, protocol: str) -> dict:
    case = draw(stream_requests(protocol))
    case["ready"] = True
    case["finish"] = "Stop"
    ids = draw(st.lists(st.one_of(st.sampled_from(SOUP_IDS), st.integers(0, 129_300)), max_size=24))
    case["ids"] = ids
    cuts = draw(
        st.lists(st.lists(st.floats(0, 1, allow_nan=False), max_size=5), min_size=1, max_size=2)
    )
    case["plans"] = (
        [{"kind": "id_groups", "cuts": [1.0]}]
        + [{"kind": "id_groups", "cuts": sorted(c)} for c in cuts]
        + [{"kind": "tokens"}]
    )
    return case
