"""Malformed and huge request bodies (issue 3): deepring_recipe vs the official wheel.

Malformed Python objects and JSON texts are fed to the request constructors of both modules
(construction and, when it succeeds, conversion with default options must give the same
outcome); huge bodies must give the same pipeline summary, in under 20 s for ours. The
generated requests are in `test_requests_conformance.py`.
"""

from __future__ import annotations

import json
import time

import deepring_recipe as ours
import deepseek_recipe as official
import pytest
import summary as S


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
