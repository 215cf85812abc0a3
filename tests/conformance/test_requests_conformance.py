"""Request conversion and rendering (issue 3): deepring_recipe vs the official wheel.

For every generated request body (valid and invalid, all three protocols, with generated
ConversionOptions) the whole pipeline runs on both modules and its summary must be identical:
construction / conversion errors (type, message, status code, body), the converted
conversation, inference and parsing options, `resolve_max_tokens`, the V4 and V4.1 prompts with
special ranges and token ids, and the Responses `namespace_tool_map` / `echo`. The documented
deviations (recipe/DEVIATIONS.md) are factored out in `summary.adjust_for_deviations`.

Fixed bodies the property test rarely draws follow it (image payload padding, Responses item
sequences, Chat prefix and strict-tool rules, bad image parts). Malformed Python objects and
JSON texts fed to the request constructors, and huge bodies: `test_requests_malformed.py`.
Examples per protocol: $DEEPRING_CONFORMANCE_EXAMPLES (default 300).
"""

from __future__ import annotations

import json
import os

import deepring_recipe as ours
import deepseek_recipe as official
import pytest
import summary as S
from deepring.conformance import bodies as sr
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
