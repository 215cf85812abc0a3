"""Request conversion and rendering (issue 3): deepring_recipe vs the official wheel.

For every generated request body (valid and invalid, all three protocols, with generated
ConversionOptions) the whole pipeline runs on both modules and its summary must be identical:
construction / conversion errors (type, message, status code, body), the converted
conversation, inference and parsing options, `resolve_max_tokens`, the V4 and V4.1 prompts with
special ranges and token ids, and the Responses `namespace_tool_map` / `echo`. The documented
deviations (recipe/DEVIATIONS.md) are factored out in `summary.adjust_for_deviations`.

A second part feeds malformed Python objects and JSON texts to the request constructors.
Examples per protocol: $DEEPRING_CONFORMANCE_EXAMPLES (default 300).
"""

from __future__ import annotations

import json
import os
import time

import deepring_recipe as ours
import deepseek_recipe as official
import pytest
import strategies_requests as sr
import summary as S
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("DEEPRING_CONFORMANCE_EXAMPLES", "300"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)


@pytest.fixture(scope="module")
def tokenizers(v41_tokenizer_path):
    path = str(v41_tokenizer_path)
    return {
        "ours": ours.Tokenizer.from_file(path),
        "official": official.Tokenizer.from_file(path),
    }


def body_text(case: dict) -> str:
    body = case["body"]
    if isinstance(body, bytes):
        return "bytes: " + body.decode("utf-8", "backslashreplace")
    if isinstance(body, str):
        return "str: " + body
    return json.dumps(body, ensure_ascii=False)


def assert_same(actual: dict, expected: dict, case: dict) -> None:
    if S.canonical_json(actual) == S.canonical_json(expected):
        return
    where = S.first_difference(actual, expected)
    raise AssertionError(
        f"deepring_recipe differs from deepseek_recipe at {where}\n"
        f"protocol: {case['protocol']}\noptions: {json.dumps(case['options'])}\n"
        f"body: {body_text(case)}"
    )


@pytest.mark.parametrize("protocol", S.PROTOCOLS)
@SETTINGS
@given(data=st.data())
def test_request_conformance(protocol, tokenizers, data):
    case = data.draw(sr.request_cases(protocol), label="case")
    note(f"body: {body_text(case)}")
    expected = S.request_summary(official, case, tokenizers["official"])
    actual = S.request_summary(ours, case, tokenizers["ours"])
    S.check_deviation_expectations(case, actual)
    actual, expected = S.adjust_for_deviations(case, actual, expected)
    assert_same(actual, expected, case)


# ---------------------------------------------------------------------------------------------
# malformed bodies


def construct(M, protocol: str, body) -> dict:
    """Construction and (when it succeeds) conversion with default options, as data."""
    ok, request = S.attempt(M, getattr(M, S.REQUEST_CLASS[protocol]), body)
    if not ok:
        return {"construct": request}
    ok, converted = S.attempt(M, request.convert, M.ConversionOptions())
    if not ok:
        return {"convert": converted}
    return {"messages": len(converted.conversation.messages)}


VALID = {
    "chat": {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "DeepSeek-V4.1-Flash", "input": "hi"},
    "messages": {
        "model": "DeepSeek-V4.1-Flash",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
    },
}


def nested(depth: int, leaf=1, kind: str = "list"):
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


def circular_dict() -> dict:
    inner: dict = {"a": 1}
    inner["self"] = inner
    return inner


def circular_list() -> list:
    inner: list = [1]
    inner.append(inner)
    return inner


def bad_python_bodies(protocol: str) -> list[tuple[str, object]]:
    valid = VALID[protocol]
    top_circular = dict(valid)
    top_circular["loop"] = top_circular
    cases: list[tuple[str, object]] = [
        ("circular dict in unknown field", dict(valid, extra=circular_dict())),
        ("circular list in unknown field", dict(valid, extra=circular_list())),
        ("circular top level", top_circular),
        ("shared (not circular) subobject", dict(valid, a=[valid["model"]] * 3, b={"x": [1]})),
    ]
    for depth in (126, 127, 128, 129, 200, 100_000):
        for kind in ("list", "dict"):
            cases.append((f"{kind} nesting {depth}", dict(valid, extra=nested(depth, kind=kind))))
    cases += [
        ("int body", 1),
        ("float body", 1.5),
        ("bool body", True),
        ("None body", None),
        ("list body", [1]),
        ("tuple body", (1,)),
        ("set body", {1, 2}),
        ("object body", object()),
        ("bytearray body", bytearray(json.dumps(valid).encode())),
        ("memoryview body", memoryview(json.dumps(valid).encode())),
        ("surrogate in str value", dict(valid, model="a\ud800")),
        ("nan value", dict(valid, extra=float("nan"))),
        ("inf value", dict(valid, extra=float("inf"))),
        ("int above u64", dict(valid, extra=2**64)),
        ("int below i64", dict(valid, extra=-(2**63) - 1)),
        ("bytes value", dict(valid, extra=b"x")),
        ("non-str key", {**valid, 1: 2}),
        ("tuple key", {**valid, (1,): 2}),
        ("set value", dict(valid, extra={1})),
        ("tuple as array", dict(valid, extra=(1, [2], {"a": (3,)}))),
        ("dict subclass", type("D", (dict,), {})(valid)),
        ("model int", dict(valid, model=1)),
        ("model list", dict(valid, model=["a"])),
        ("model missing", {k: v for k, v in valid.items() if k != "model"}),
    ]
    if protocol != "responses":
        cases += [
            ("messages null", dict(valid, messages=None)),
            ("messages object", dict(valid, messages={"role": "user"})),
            ("message string", dict(valid, messages=["hi"])),
            ("role int", dict(valid, messages=[{"role": 1, "content": "x"}])),
            ("content int", dict(valid, messages=[{"role": "user", "content": 5}])),
            ("content object", dict(valid, messages=[{"role": "user", "content": {"a": 1}}])),
            ("parts of ints", dict(valid, messages=[{"role": "user", "content": [1, 2]}])),
        ]
    else:
        cases += [
            ("input int", dict(valid, input=5)),
            ("input object", dict(valid, input={"role": "user"})),
            ("item string", dict(valid, input=["hi"])),
            ("item no role", dict(valid, input=[{"content": "x"}])),
        ]
    cases += [
        ("temperature string", dict(valid, temperature="hot")),
        ("max_tokens negative", dict(valid, max_tokens=-1)),
        ("max_tokens float", dict(valid, max_tokens=1.5)),
        ("max_tokens huge", dict(valid, max_tokens=2**40)),
        ("stream string", dict(valid, stream="yes")),
        ("tools object", dict(valid, tools={"name": "f"})),
        ("tools strings", dict(valid, tools=["f"])),
    ]
    return cases


def bad_json_texts(protocol: str) -> list[tuple[str, object]]:
    valid = json.dumps(VALID[protocol])
    inner = valid[1:-1]
    return [
        ("empty", ""),
        ("open brace", "{"),
        ("missing value", '{"model": }'),
        ("trailing comma", valid[:-1] + ",}"),
        ("trailing characters", valid + " x"),
        ("trailing newline", valid + "\n"),
        ("leading spaces", "  " + valid),
        ("null", "null"),
        ("empty array", "[]"),
        ("number", "1"),
        ("NaN", "NaN"),
        ("duplicate key", "{" + inner + ', "model": "gpt-4o"}'),
        ("lone surrogate escape", '{"model": "\\ud800"}'),
        ("bad escape", '{"model": "\\x41"}'),
        ("control character", '{"model": "a\u0001b"}'),
        ("nesting 127", '{"x": ' + "[" * 126 + "]" * 126 + ", " + inner + "}"),
        ("nesting 200", '{"x": ' + "[" * 200 + "]" * 200 + ", " + inner + "}"),
        ("nesting 100000", '{"x": ' + "[" * 100_000 + "]" * 100_000 + ", " + inner + "}"),
        ("bytes invalid utf-8", b'{"model": "\xff", "messages": []}'),
        ("bytes only 0xff", b"\xff"),
        ("bytes BOM", b"\xef\xbb\xbf" + valid.encode()),
        ("bytes overlong", b'{"model": "\xc0\xaf"}'),
        ("bytes truncated utf-8", b'{"model": "a\xe6\x97"}'),
        ("bytes utf-16", valid.encode("utf-16")),
        ("bytes lone surrogate escape", b'{"model": "\\udc00"}'),
        ("bytes ok", valid.encode()),
        # Unknown fields, which the typed fast path skips without building them: whatever a
        # JSON value refuses there must still be refused.
        ("unknown field 1e400", "{" + inner + ', "junk": 1e400}'),
        ("unknown field -1E+309", "{" + inner + ', "junk": [-1E+309]}'),
        ("unknown field 400 digits", "{" + inner + ', "junk": ' + "9" * 400 + "}"),
        ("unknown field 1e-400", "{" + inner + ', "junk": 1e-400}'),
        ("unknown field lone surrogate", "{" + inner + ', "junk": "\\ud800"}'),
        ("unknown field trailing surrogate", "{" + inner + ', "junk": "\\udc00x"}'),
        ("unknown field surrogate pair", "{" + inner + ', "junk": "\\ud83d\\ude00"}'),
        ("bytes unknown field invalid utf-8", b"{" + inner.encode() + b', "junk": "\xff"}'),
        ("message unknown field 1e400", inner_message_junk(protocol, "1e400")),
        ("message unknown field lone surrogate", inner_message_junk(protocol, '"\\udc00"')),
        ("message duplicate content", inner_message_junk(protocol, '"x"', "content")),
        ("message duplicate role", inner_message_junk(protocol, '"user"', "role")),
    ]


def inner_message_junk(protocol: str, value: str, key: str = "junk") -> str:
    """A valid body whose first message also has `key` set to the JSON text `value`."""
    body = dict(VALID[protocol])
    if protocol == "responses":
        body["input"] = [{"role": "user", "content": "hi"}]
    field = "input" if protocol == "responses" else "messages"
    text = json.dumps(body)
    message = json.dumps(body[field][0])
    return text.replace(message, message[:-1] + f', "{key}": {value}}}', 1)


def bad_cases():
    for protocol in S.PROTOCOLS:
        for name, body in bad_python_bodies(protocol) + bad_json_texts(protocol):
            yield pytest.param(protocol, body, id=f"{protocol}-{name}")


@pytest.mark.parametrize(("protocol", "body"), list(bad_cases()))
def test_malformed_body(protocol, body):
    expected = construct(official, protocol, body)
    actual = construct(ours, protocol, body)
    assert actual == expected


def huge_bodies(protocol: str) -> list[tuple[str, object]]:
    valid = VALID[protocol]
    big = "x" * (10 * 1024 * 1024)
    if protocol == "responses":
        one = dict(valid, input=big)
        many = dict(valid, input=[{"role": "user", "content": "hello"}] * 20_000)
    else:
        one = dict(valid, messages=[{"role": "user", "content": big}])
        many = dict(valid, messages=[{"role": "user", "content": "hello"}] * 20_000)
    return [
        ("10MB content dict", one),
        ("10MB content str", json.dumps(one)),
        ("10MB content bytes", json.dumps(one).encode()),
        ("20k messages", many),
        ("10MB unknown field", dict(valid, junk=["y" * 1024] * 10_240)),
    ]


@pytest.mark.parametrize(
    ("protocol", "name"),
    [(p, name) for p in S.PROTOCOLS for name, _ in huge_bodies(p)],
)
def test_huge_body(protocol, name):
    body = dict(huge_bodies(protocol))[name]
    case = {"protocol": protocol, "body": body, "options": {}}
    expected = S.request_summary(official, case)
    start = time.perf_counter()
    actual = S.request_summary(ours, case)
    elapsed = time.perf_counter() - start
    assert S.canonical_json(actual) == S.canonical_json(expected)
    assert elapsed < 20, f"{elapsed:.1f}s for a {name} body"


# ---------------------------------------------------------------------------------------------
# image payloads

PAYLOADS = [
    "", "QUJD", "QUJD=", "QUJD==", "QUJD====", "QQ", "QQ=", "QQ==", "QQ===", "QUI", "QUI=",
    "QUI==", "=", "====", "Q", "Q===", "QUJ=", "QQ=a", "=QUJD", "Q Q==", " QQ== ", "QQ==\n",
    "-_8=", "aGk", "aGk=", "aGk==", "QUJ", "ab", "ab==", "a===", "QUJDQQ", "QUJDQQ=",
]  # fmt: skip


def image_body(protocol: str, payload: str) -> dict:
    url = "data:image/png;base64," + payload
    if protocol == "chat":
        part = {"type": "image_url", "image_url": {"url": url}}
        return {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": [part]}]}
    if protocol == "responses":
        part = {"type": "input_image", "image_url": url}
        return {"model": "DeepSeek-V4.1-Flash", "input": [{"role": "user", "content": [part]}]}
    source = {"type": "base64", "media_type": "image/png", "data": payload}
    return {
        "model": "DeepSeek-V4.1-Flash",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
    }


@pytest.mark.parametrize("protocol", S.PROTOCOLS)
def test_image_payload_padding(protocol, tokenizers):
    """Base64 payloads with missing, short, long and misplaced padding: data URLs accept none
    or canonical padding; Messages sources accept any padding and are rewritten canonically.
    (A Messages case found by the property test above.)"""
    for payload in PAYLOADS:
        case = {"protocol": protocol, "body": image_body(protocol, payload), "options": {}}
        expected = S.request_summary(official, case, tokenizers["official"])
        actual = S.request_summary(ours, case, tokenizers["ours"])
        assert_same(actual, expected, case)


# ---------------------------------------------------------------------------------------------
# Responses item sequences


def _call(call_id: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def _output(call_id: str | None, text: str = "r") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _reasoning(text: str) -> dict:
    return {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


USER = {"role": "user", "content": "q"}
ITEM_SEQUENCES = {
    "assistants in a row join": [USER, _assistant("A"), _assistant("X"), _assistant("Y")],
    "empty assistants are dropped from the join": [USER, _assistant(""), _assistant("X")],
    "an empty one after text": [USER, _assistant("A\n"), _assistant(""), _assistant("\nX")],
    "reasoning starts a new turn": [USER, _assistant("A"), _reasoning("r"), _assistant("X")],
    "reasoning then two": [USER, _reasoning("r"), _assistant("A"), _assistant("X")],
    "join then calls": [USER, _assistant("A"), _assistant("X"), _call("a"), _output("a")],
    "after tool output": [USER, _call("a"), _output("a"), _assistant("A"), _assistant("X")],
    "parts then text": [
        USER,
        {"role": "assistant", "content": [{"type": "output_text", "text": "P"}] * 2},
        _assistant("X"),
    ],
    "output without id closes the calls": [USER, _call("a"), _output(None), _output("a")],
    "output without id after the answers": [USER, _call("a"), _output("a"), _output(None)],
    "outputs without id, several calls": [
        USER,
        _call("a"),
        _call("b"),
        _output("a"),
        _output(None),
        _output("b"),
    ],
    "two calls, one answered": [USER, _call("a"), _call("b"), _output("b"), USER],
}


@pytest.mark.parametrize("name", list(ITEM_SEQUENCES))
def test_responses_item_sequences(name, tokenizers):
    """Input item orders the property test rarely draws: assistant messages in a row (one turn
    for the official) and outputs without a call id (which end the calls before them)."""
    body = {
        "model": "DeepSeek-V4.1-Flash",
        "input": ITEM_SEQUENCES[name],
        "tools": [{"type": "function", "name": "f"}],
    }
    case = {"protocol": "responses", "body": body, "options": {}}
    expected = S.request_summary(official, case, tokenizers["official"])
    actual = S.request_summary(ours, case, tokenizers["ours"])
    actual, expected = S.adjust_for_deviations(case, actual, expected)
    assert_same(actual, expected, case)


# ---------------------------------------------------------------------------------------------
# Chat prefix continuations against response formats and tools

PREFIX_FORMATS = [
    None,
    {"type": "text"},
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
    {"type": "regex", "regex": "a+"},
]


@pytest.mark.parametrize("tools", [False, True])
@pytest.mark.parametrize("fmt", PREFIX_FORMATS, ids=lambda f: f and f["type"])
def test_chat_prefix_rules(fmt, tools, tokenizers):
    """A prefix continuation refuses a json_object format (checked before tools)."""
    body: dict = {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [
            {"role": "user", "content": "Answer in json."},
            {"role": "assistant", "content": "{", "prefix": True},
        ],
        "temperature": 5,  # an error checked later, which must not win
    }
    if fmt is not None:
        body["response_format"] = fmt
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "f"}}]
    case = {"protocol": "chat", "body": body, "options": {}}
    expected = S.request_summary(official, case, tokenizers["official"])
    actual = S.request_summary(ours, case, tokenizers["ours"])
    assert_same(actual, expected, case)


# ---------------------------------------------------------------------------------------------
# Chat: the order of the checks around strict tools

_STRICT_TOOLS = {
    "mixed": [
        {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "b", "strict": True, "parameters": {}}},
    ],
    "with_format": [{"type": "function", "function": {"name": "a", "strict": True}}],
}
_LATER_OR_EARLIER = {
    "empty_stop": {"stop": [""]},
    "empty_stop_string": {"stop": ""},
    "stream_options": {"stream_options": {"include_usage": True}},
    "n": {"n": 2},
    "temperature": {"temperature": 5},
    "seed": {"seed": 2**63},
}


@pytest.mark.parametrize("other", sorted(_LATER_OR_EARLIER))
@pytest.mark.parametrize("strict", sorted(_STRICT_TOOLS))
def test_chat_strict_tool_rules_order(strict, other, tokenizers):
    """Strict-tool errors come after `stop` and `stream_options`, before `n` and sampling."""
    body: dict = {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [{"role": "user", "content": "Answer in json."}],
        "tools": _STRICT_TOOLS[strict],
        **_LATER_OR_EARLIER[other],
    }
    if strict == "with_format":
        body["response_format"] = {"type": "json_object"}
    case = {"protocol": "chat", "body": body, "options": {}}
    expected = S.request_summary(official, case, tokenizers["official"])
    actual = S.request_summary(ours, case, tokenizers["ours"])
    assert_same(actual, expected, case)


# ---------------------------------------------------------------------------------------------
# Image parts: which error a message with several bad parts names

_NOT_BASE64 = "data:image/png,abc%20"
_BAD_BASE64 = "data:image/png;base64,@@@"
_GOOD = "data:image/png;base64,iVBORw0KGgo="
_BMP = "data:image/bmp;base64,AAAA"


def _chat_image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _chat_file(**fields: str) -> dict:
    return {"type": "file", **fields}


def _rs_image(url: str | None = None, file_id: str | None = None) -> dict:
    part: dict = {"type": "input_image"}
    if url is not None:
        part["image_url"] = url
    if file_id is not None:
        part["file_id"] = file_id
    return part


# URLs are checked once the whole message was read; file parts, missing URLs and an
# assistant's image are reported where they stand, so they win over an earlier bad URL.
_CHAT_IMAGE_PARTS = {
    "not_base64_then_bad_base64": [_chat_image(_NOT_BASE64), _chat_image(_BAD_BASE64)],
    "bad_base64_then_not_base64": [_chat_image(_BAD_BASE64), _chat_image(_NOT_BASE64)],
    "bmp_then_not_base64": [_chat_image(_BMP), _chat_image(_NOT_BASE64)],
    "not_base64_then_empty_file": [_chat_image(_NOT_BASE64), _chat_file()],
    "not_base64_then_file_id": [_chat_image(_NOT_BASE64), _chat_file(file_id="f")],
    "not_base64_then_bad_file_data": [_chat_image(_NOT_BASE64), _chat_file(file_data="zzz")],
    "not_base64_then_bmp_file": [_chat_image(_NOT_BASE64), _chat_file(file_data=_BMP)],
    "good_file_then_not_base64": [_chat_file(file_data=_GOOD), _chat_image(_NOT_BASE64)],
    "good_url_good_file_text": [
        _chat_image(_GOOD),
        _chat_file(file_data=_GOOD),
        {"type": "text", "text": "x"},
    ],
}


@pytest.mark.parametrize("role", ["user", "assistant"])
@pytest.mark.parametrize("name", sorted(_CHAT_IMAGE_PARTS))
def test_chat_image_part_errors(name, role, tokenizers):
    body = {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": role, "content": _CHAT_IMAGE_PARTS[name]},
        ],
    }
    case = {"protocol": "chat", "body": body, "options": {}}
    expected = S.request_summary(official, case, tokenizers["official"])
    actual = S.request_summary(ours, case, tokenizers["ours"])
    assert_same(actual, expected, case)


_RS_IMAGE_PARTS = {
    "not_base64_then_file_id": [_rs_image(_NOT_BASE64), _rs_image(file_id="f")],
    "bad_base64_then_file_id": [_rs_image(_BAD_BASE64), _rs_image(file_id="f")],
    "bmp_then_file_id": [_rs_image(_BMP), _rs_image(file_id="f")],
    "not_base64_then_empty_url": [_rs_image(_NOT_BASE64), _rs_image("")],
    "not_base64_then_bad_base64": [_rs_image(_NOT_BASE64), _rs_image(_BAD_BASE64)],
    "empty_url_and_file_id": [_rs_image("", "f")],
    "empty_file_id": [_rs_image(file_id="")],
    "good_then_file_id": [_rs_image(_GOOD), _rs_image(file_id="f")],
    "not_base64_alone": [_rs_image(_NOT_BASE64)],
}


@pytest.mark.parametrize("where", ["user", "assistant", "tool_output"])
@pytest.mark.parametrize("name", sorted(_RS_IMAGE_PARTS))
def test_responses_image_part_errors(name, where, tokenizers):
    parts = _RS_IMAGE_PARTS[name]
    if where == "tool_output":
        items = [
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": parts},
        ]
    else:
        items = [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"role": where, "content": parts},
        ]
    body = {"model": "DeepSeek-V4.1-Flash", "input": items}
    case = {"protocol": "responses", "body": body, "options": {}}
    expected = S.request_summary(official, case, tokenizers["official"])
    actual = S.request_summary(ours, case, tokenizers["ours"])
    assert_same(actual, expected, case)
