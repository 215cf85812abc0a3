"""Every top-level field and the nested content of a request body through Recipe.prepare
(protocol.fields, protocol.nested): each is honoured, or refused with a 400 naming it in the
API's shape; nothing is dropped silently (docs/configuration.md, "Request fields")."""

from __future__ import annotations

import json

import pytest
from deepring.protocol.errors import ApiError
from deepring.protocol.formats import PromptFormat
from deepring.protocol.prepare import CHAT, MESSAGES, RESPONSES, Recipe

BODIES = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"model": "m", "input": "hi"},
    MESSAGES: {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]},
}
PATHS = {CHAT: "/v1/chat/completions", RESPONSES: "/v1/responses", MESSAGES: "/v1/messages"}
PNG = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
DATA_URL = f"data:image/png;base64,{PNG}"
TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "required": ["x"],
        },
    },
}
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": TOOL["function"]["parameters"]}
MESSAGES_TOOL = {"name": "f", "input_schema": TOOL["function"]["parameters"]}


@pytest.fixture(scope="module")
def recipe(v41_tokenizer_path):
    return Recipe(v41_tokenizer_path, ["m"], PromptFormat.V4, default_thinking=False)


def _prepare(recipe, api, body):
    """prepare() of the body as a dict, text and bytes: the same outcome each time."""
    text = json.dumps(body)
    outcomes = []
    for b in (body, text, text.encode()):
        try:
            outcomes.append(recipe.prepare(api, b, 4096))
        except ApiError as e:
            outcomes.append(e)
    first = outcomes[0]
    if isinstance(first, ApiError):
        assert all(isinstance(o, ApiError) and o.message == first.message for o in outcomes)
    else:
        assert not any(isinstance(o, ApiError) for o in outcomes), outcomes
    return first


def _refused(recipe, api, param, message, **fields):
    """The body with `fields` is a 400 whose message holds `message`; OpenAI's param is
    `param`, and /v1/messages answers in Anthropic's shape."""
    e = _prepare(recipe, api, {**BODIES[api], **fields})
    assert isinstance(e, ApiError), f"{fields} was accepted"
    assert e.status == 400
    assert message in e.message, e.message
    body = json.loads(e.body(PATHS[api]))
    if api is MESSAGES:
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"] == e.message
        assert e.message.startswith(param), e.message  # Anthropic names the field first
    else:
        assert body["error"]["param"] == param
        assert body["error"]["message"] == e.message
    return e


def _echo(prep) -> dict:
    """The Responses object a prepared request reports (its first event's)."""
    from deepring.protocol.output import ready_events

    events = ready_events(prep, 0)
    return json.loads(events[0].to_json())["response"]


# ---- unknown fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "message"),
    [
        (CHAT, "Unrecognized request argument supplied: frobnicate"),
        (RESPONSES, "Unknown parameter: 'frobnicate'."),
        (MESSAGES, "frobnicate: Extra inputs are not permitted"),
    ],
)
def test_an_unknown_top_level_field_is_refused_by_name(recipe, api, message):
    e = _refused(recipe, api, "frobnicate", message, frobnicate=1)
    assert e.message == message
    # A field of another API is unknown too (Responses has no Chat-style thinking switch).
    other = {CHAT: "input", RESPONSES: "thinking", MESSAGES: "max_completion_tokens"}[api]
    _refused(recipe, api, other, other, **{other: None})


def test_known_fields_with_neutral_values_are_served(recipe):
    neutral = {
        CHAT: {
            "store": False,
            "service_tier": "auto",
            "metadata": {},
            "user": "u",
            "safety_identifier": "s",
            "prompt_cache_key": "k",
            "modalities": ["text"],
            "verbosity": "medium",
            "parallel_tool_calls": True,
            "audio": None,
            "functions": None,
            "prediction": None,
            "web_search_options": None,
        },
        RESPONSES: {
            "store": False,
            "background": False,
            "truncation": "disabled",
            "service_tier": "default",
            "previous_response_id": None,
            "conversation": None,
            "prompt": None,
            "include": ["reasoning.encrypted_content"],
            "stream_options": {"include_obfuscation": False},
            "text": {"verbosity": "medium"},
            "max_tool_calls": 2,
        },
        MESSAGES: {
            "service_tier": "standard_only",
            "container": None,
            "mcp_servers": [],
            "metadata": {"user_id": "u"},
            "context_management": None,
        },
    }
    for api, fields in neutral.items():
        assert not isinstance(_prepare(recipe, api, {**BODIES[api], **fields}), ApiError)


# ---- refused values ----------------------------------------------------------------------------

REFUSED = [
    (CHAT, "store", True, "stores nothing"),
    (CHAT, "metadata", {"k": "v"}, "metadata"),
    (CHAT, "service_tier", "flex", "one tier"),
    (CHAT, "prompt_cache_retention", "24h", "TTLs"),
    (CHAT, "verbosity", "low", "verbosity"),
    (CHAT, "modalities", ["text", "audio"], "audio"),
    (CHAT, "audio", {"voice": "x"}, "audio"),
    (CHAT, "prediction", {"type": "content", "content": "x"}, "predicted"),
    (CHAT, "web_search_options", {}, "web search"),
    (CHAT, "functions", [{"name": "f"}], "use tools"),
    (CHAT, "function_call", "auto", "tool_choice"),
    (CHAT, "user", 5, "expected a string"),
    (RESPONSES, "previous_response_id", "resp_123", "Previous response with id 'resp_123' not "
                                                    "found."),
    (RESPONSES, "conversation", {"id": "conv_1"}, "Conversation with id 'conv_1' not found."),
    (RESPONSES, "store", True, "stores nothing"),
    (RESPONSES, "background", True, "background"),
    (RESPONSES, "truncation", "auto", "never truncated"),
    (RESPONSES, "service_tier", "priority", "one tier"),
    (RESPONSES, "prompt", {"id": "pmpt_1"}, "prompt templates"),
    (RESPONSES, "prompt_cache_retention", "in_memory", "TTLs"),
    (RESPONSES, "metadata", {"k": 5}, "string value"),
    (RESPONSES, "metadata", {f"k{i}": "v" for i in range(17)}, "16 pairs"),
    (RESPONSES, "max_tool_calls", 0, "max_tool_calls"),
    (RESPONSES, "include", ["file_search_call.nope"], "is not supported"),
    (RESPONSES, "stream_options", "x", "expected an object"),
    (RESPONSES, "text.verbosity", {"verbosity": "high"}, "verbosity control"),
    (MESSAGES, "container", "c_1", "code execution"),
    (MESSAGES, "mcp_servers", [{"type": "url", "url": "http://x"}], "MCP"),
    (MESSAGES, "service_tier", "priority", "standard_only"),
    (MESSAGES, "context_management", {"edits": []}, "never edited"),
    (MESSAGES, "output_format", {"type": "json"}, "json_schema"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("api", "field", "value", "message"),
    REFUSED,
    ids=[f"{a.name}-{f}-{i}" for i, (a, f, _, _) in enumerate(REFUSED)],
)
def test_a_field_that_is_not_served_is_refused_by_name(recipe, api, field, value, message):
    key = "text" if field == "text.verbosity" else field
    _refused(recipe, api, field, message, **{key: value})


def test_the_first_offending_field_in_the_body_is_named(recipe):
    e = _prepare(recipe, RESPONSES, {**BODIES[RESPONSES], "truncation": "auto", "store": True})
    assert "truncation" in e.message
    e = _prepare(recipe, CHAT, {**BODIES[CHAT], "store": True, "nope": 1})
    assert "nope" in e.message  # unknown fields first


# ---- clearer messages for what the protocol types refuse --------------------------------------


def test_a_decimal_integer_is_refused_in_each_apis_words(recipe):
    e = _refused(
        recipe,
        RESPONSES,
        "max_output_tokens",
        "Invalid type for 'max_output_tokens': "
        "expected an integer, but got a decimal number instead.",
        max_output_tokens=16.0,
    )
    assert json.loads(e.body("/v1/responses"))["error"]["code"] == "invalid_type"
    _refused(recipe, CHAT, "max_tokens", "'max_tokens': expected an integer", max_tokens=16.5)
    _refused(
        recipe,
        MESSAGES,
        "max_tokens",
        "max_tokens: Input should be a valid integer",
        max_tokens=9.0,
    )


OTHER = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_allowed_tools_restricts_the_calls_not_the_prompt(recipe, mode):
    """Every tool stays in the prompt (the same token ids as tool_choice = the mode); the
    grammar lets the model call only the allowed ones."""
    kind = "tool_call" if mode == "auto" else "tool_call_required"
    chat = {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [
        {"type": "function", "function": {"name": "g"}}]}}  # fmt: skip
    resp = {"type": "allowed_tools", "mode": mode, "tools": [{"type": "function", "name": "g"}]}
    r_other = {"type": "function", "name": "g", "parameters": {"type": "object"}}
    cases = ((CHAT, [TOOL, OTHER], chat), (RESPONSES, [RESPONSES_TOOL, r_other], resp))
    for api, tools, choice in cases:
        plain = _prepare(recipe, api, {**BODIES[api], "tools": tools, "tool_choice": mode})
        got = _prepare(recipe, api, {**BODIES[api], "tools": tools, "tool_choice": choice})
        assert got.prompt_ids == plain.prompt_ids
        assert got.constraint.kind == plain.constraint.kind == kind
        assert _grammar(got) != _grammar(plain)
        only_g = {**BODIES[api], "tools": tools[1:], "tool_choice": mode}
        assert _grammar(got) == _grammar(_prepare(recipe, api, only_g))


def _resp_choice(mode="auto", tools=({"type": "function", "name": "f"},)):
    return {"type": "allowed_tools", "mode": mode, "tools": list(tools)}


def _chat_choice(mode="auto", tools=({"type": "function", "function": {"name": "f"}},)):
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": list(tools)}}


@pytest.mark.parametrize(
    ("api", "choice", "message"),
    [
        (RESPONSES, _resp_choice(tools=()), "at least one tool"),
        (RESPONSES, _resp_choice(mode="any"), "'mode' must be one of"),
        (RESPONSES, _resp_choice(tools=[{"type": "web_search"}]), "only function and custom"),
        (RESPONSES, _resp_choice(tools=[{"type": "function", "name": "x"}]), "'x', which is not"),
        (CHAT, _chat_choice(tools=()), "at least one tool"),
        (CHAT, {"type": "allowed_tools", "mode": "auto"}, "expected an object 'allowed_tools'"),
        (CHAT, _chat_choice(tools=[{"type": "function", "name": "f"}]), '"function": {"name"'),
        (CHAT, _chat_choice(tools=[{"type": "function", "function": {"name": "x"}}]), "'x', which"),
    ],
)
def test_malformed_allowed_tools_are_refused_naming_tool_choice(recipe, api, choice, message):
    tools = [TOOL] if api == CHAT else [RESPONSES_TOOL]
    _refused(recipe, api, "tool_choice", message, tools=tools, tool_choice=choice)


# ---- nested content ----------------------------------------------------------------------------

NESTED = [
    (CHAT, "messages[0].content[1]", "vision encoder", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": DATA_URL}}]}]}),
    (CHAT, "messages[0].content[0]", "file input", {"messages": [{"role": "user", "content": [
        {"type": "file", "file_data": DATA_URL}]}]}),
    (RESPONSES, "input[0].content[0]", "vision encoder", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": DATA_URL}]}]}),
    (RESPONSES, "input[0].content[0]", "file input", {"input": [{"role": "user", "content": [
        {"type": "input_file", "file_data": "x"}]}]}),
    (RESPONSES, "input[2].output[0]", "vision encoder", {"tools": [RESPONSES_TOOL], "input": [
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_image", "image_url": DATA_URL}]}]}),
    (RESPONSES, "input[0]", "item_reference", {"input": [{"type": "item_reference", "id": "m"},
                                                         {"role": "user", "content": "x"}]}),
    (RESPONSES, "input[1]", "'web_search_call' items", {"input": [
        {"role": "user", "content": "x"}, {"type": "web_search_call", "id": "w"}]}),
    (RESPONSES, "tools[1]", "'web_search' tools", {"tools": [RESPONSES_TOOL,
                                                             {"type": "web_search"}]}),
    (RESPONSES, "tools[0]", "'apply_patch' tools", {"tools": [{"type": "apply_patch"}]}),
    (RESPONSES, "tools[0]", "'file_search' tools", {"tools": [{"type": "file_search"}]}),
    (RESPONSES, "tools[0]", "'code_interpreter' tools", {"tools": [
        {"type": "code_interpreter", "container": {"type": "auto"}}]}),
    (MESSAGES, "messages.0.content.0", "vision encoder", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": PNG}}]}]}),
    (MESSAGES, "messages.0.content.0", "document input", {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "hello"}}]}]}),
    (MESSAGES, "messages.2.content.0.content.1", "vision encoder", {"tools": [MESSAGES_TOOL],
        "messages": [{"role": "user", "content": "x"},
                     {"role": "assistant", "content": [
                         {"type": "tool_use", "id": "t", "name": "f", "input": {"x": 1}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                      "content": [{"type": "text", "text": "ok"}, {"type": "image", "source": {
                          "type": "url", "url": "https://example.com/a.png"}}]}]}]}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("api", "where", "message", "fields"), NESTED, ids=[f"{a.name}-{m}" for a, _, m, _ in NESTED]
)
def test_nested_content_that_is_not_served_is_refused_where_it_is(
    recipe, api, where, message, fields
):
    _refused(recipe, api, where, message, **fields)


def test_a_type_tag_in_tool_arguments_is_not_content(recipe):
    body = {
        "tools": [MESSAGES_TOOL],
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t", "name": "f", "input": {"type": "image", "x": 1}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
            },
        ],
    }
    assert not isinstance(_prepare(recipe, MESSAGES, {**BODIES[MESSAGES], **body}), ApiError)


# ---- honoured through the grammar and the echo --------------------------------------------------


def _grammar(prep) -> str:
    assert prep.constraint is not None
    return prep.constraint.grammar


def test_parallel_tool_calls_false_allows_one_call(recipe):
    base = _prepare(recipe, CHAT, {**BODIES[CHAT], "tools": [TOOL]})
    one = _prepare(recipe, CHAT, {**BODIES[CHAT], "tools": [TOOL], "parallel_tool_calls": False})
    assert "calls: invoke+ " in _grammar(base)
    assert "calls: invoke " in _grammar(one)
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    msg = _prepare(
        recipe, MESSAGES, {**BODIES[MESSAGES], "tools": [MESSAGES_TOOL], "tool_choice": choice}
    )
    assert "calls: invoke " in _grammar(msg)
    # Without tools there is nothing to enforce.
    assert _prepare(recipe, CHAT, {**BODIES[CHAT], "parallel_tool_calls": False}).constraint is None


def test_messages_tool_choice_any_must_call_a_tool(recipe):
    body = {**BODIES[MESSAGES], "tools": [MESSAGES_TOOL], "tool_choice": {"type": "any"}}
    prep = _prepare(recipe, MESSAGES, body)
    assert prep.constraint.kind == "tool_call_required"
    assert _grammar(prep).splitlines()[1].startswith('start: "<" <[')
    _refused(
        recipe,
        MESSAGES,
        "tool_choice",
        "Thinking may not be enabled",
        tools=[MESSAGES_TOOL],
        tool_choice={"type": "any"},
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    _refused(
        recipe, MESSAGES, "tool_choice", "needs at least one tool", tool_choice={"type": "any"}
    )


def test_messages_output_format_is_enforced(recipe):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "schema": schema}
    for fields in ({"output_format": fmt}, {"output_config": {"format": fmt}}):
        prep = _prepare(recipe, MESSAGES, {**BODIES[MESSAGES], **fields})
        assert prep.constraint.kind == "json"
        assert '"required": ["a"]' in _grammar(prep)
    _refused(
        recipe,
        MESSAGES,
        "output_format",
        "together with tools",
        output_format=fmt,
        tools=[MESSAGES_TOOL],
    )


def test_responses_echo_reports_what_is_served(recipe):
    plain = _echo(_prepare(recipe, RESPONSES, BODIES[RESPONSES]))
    assert plain["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert (plain["parallel_tool_calls"], plain["metadata"], plain["store"]) == (True, {}, False)
    fields = {
        "metadata": {"team": "a"},
        "parallel_tool_calls": False,
        "max_tool_calls": 3,
        "prompt_cache_key": "k",
        "safety_identifier": "s",
        "presence_penalty": 0.5,
        "frequency_penalty": -1,
        "tools": [RESPONSES_TOOL],
        "text": {"verbosity": "medium"},
    }
    echo = _echo(_prepare(recipe, RESPONSES, {**BODIES[RESPONSES], **fields}))
    assert echo["metadata"] == {"team": "a"}
    assert (echo["parallel_tool_calls"], echo["max_tool_calls"]) == (False, 3)
    assert (echo["prompt_cache_key"], echo["safety_identifier"]) == ("k", "s")
    assert (echo["presence_penalty"], echo["frequency_penalty"]) == (0.5, -1.0)


def test_a_forced_function_call_is_constrained_to_a_complete_call(recipe):
    body = {
        **BODIES[RESPONSES],
        "tools": [RESPONSES_TOOL],
        "tool_choice": {"type": "function", "name": "f"},
    }
    prep = _prepare(recipe, RESPONSES, body)
    assert prep.constraint.kind == "tool_call_required"
    assert "start: calls" in _grammar(prep)


def test_thinking_budget_reaches_the_sampling_params(recipe):
    """budget_tokens bounds the reasoning (enforced by the engine: test_thinking_budget) when
    the output starts in thinking mode; otherwise there is nothing to bound."""
    think_end = recipe.tokenizer.token_to_id("</think>")
    on = {"type": "enabled", "budget_tokens": 1500}
    chat_on = {"type": "enabled", "budget_tokens": 7}
    for api, body in ((MESSAGES, {"thinking": on}), (CHAT, {"thinking": chat_on})):
        p = _prepare(recipe, api, {**BODIES[api], **body}).params
        want = body["thinking"]["budget_tokens"]
        assert (p.thinking_budget, p.think_end_id) == (want, think_end)
    for api, body in (
        (MESSAGES, {"thinking": {"type": "disabled"}}),
        (MESSAGES, {}),
        (CHAT, {"thinking": {"type": "enabled"}}),  # no budget: max_tokens bounds it
        (CHAT, {"thinking": {"type": "disabled", "budget_tokens": 5}}),
    ):
        p = _prepare(recipe, api, {**BODIES[api], **body}).params
        assert p.thinking_budget is None, body
