"""Every top-level field of a request body: honoured, refused with a 400 that names it, or kept
where that is all a field can mean (an end-user identifier). docs/configuration.md ("Request
fields") has the table; protocol.nested does the same for content inside the body.

deepring_recipe reads what the official library reads, and the official accepts and ignores a
lot: unknown fields, and fields it parses and drops (`store`, `previous_response_id`,
`parallel_tool_calls`, Messages `output_format`, ...). A server must not pretend to do what it
does not. `check` looks at the body's outline (`deepring_recipe.request_outline`: its top-level
keys, its `type` tags at any depth and the fields named in NAMES, in one scan that builds
nothing else) once the recipe has converted it, refuses what is not served, and returns what
serving must enforce beyond the recipe's conversion (`Served`).

Messages follow each API: OpenAI's "Unrecognized request argument supplied: X" (Chat
Completions) and "Unknown parameter: 'X'." (Responses) with `param`; Anthropic's "X: Extra
inputs are not permitted".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deepring_recipe import ConversationRequest, request_fields, request_outline

from deepring.protocol import nested
from deepring.protocol.errors import ApiError, field_error
from deepring.protocol.sampling import FIELDS as SAMPLING_FIELDS

CHAT, RESPONSES, MESSAGES = "chat.completions", "responses", "messages"

# Read and checked by the recipe's conversion, with its messages.
_RECIPE = {
    CHAT: {"messages", "model", "frequency_penalty", "presence_penalty", "logprobs",
           "top_logprobs", "max_tokens", "max_completion_tokens", "n", "seed", "stop", "stream",
           "stream_options", "temperature", "top_p", "response_format", "tools", "tool_choice",
           "reasoning_effort", "thinking"},
    RESPONSES: {"model", "input", "instructions", "max_output_tokens", "reasoning", "stream",
                "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user"},
    MESSAGES: {"model", "messages", "max_tokens", "system", "stop_sequences", "stream",
               "temperature", "top_p", "thinking", "tool_choice", "tools", "metadata"},
}  # fmt: skip


@dataclass
class Served:
    """What a request asks of serving beyond the recipe's conversion."""

    # At most one tool call (parallel_tool_calls false, disable_parallel_tool_use true).
    single_call: bool = False
    # The output must call a tool (Messages tool_choice any, which the recipe makes auto).
    must_call: bool = False
    # The JSON Schema the answer must match (Messages output_format / output_config.format).
    output_schema: dict | None = None
    # Tokens of reasoning before `</think>` is forced (thinking.budget_tokens), when thinking.
    thinking_budget: int | None = None
    # Responses: what the response object reports beyond the recipe's echo
    # (ResponsesEcho.with_served keyword arguments).
    echo: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Ctx:
    api: str
    conv: ConversationRequest
    has_tools: bool  # tools remain after conversion (tool_choice none empties the list)
    served: Served


def _refuse(ctx: _Ctx, name: str, message: str, code: str = "invalid_request_error") -> ApiError:
    """A 400 naming the field; Anthropic's messages start with the field's name."""
    if ctx.api == MESSAGES and not message.startswith(f"{name}:"):
        message = f"{name}: {message}"
    return field_error(name, message, code)


def _unknown(api: str, name: str) -> ApiError:
    if api == CHAT:
        return field_error(
            name, f"Unrecognized request argument supplied: {name}", "unknown_parameter"
        )
    if api == RESPONSES:
        return field_error(name, f"Unknown parameter: '{name}'.", "unknown_parameter")
    return ApiError(400, f"{name}: Extra inputs are not permitted")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---- the checks of single fields: (ctx, name, value) -> None, raising ApiError ------------------


def _only(*allowed: Any, why: str) -> Callable[[_Ctx, str, Any], None]:
    """Refused unless null or one of `allowed` (compared with its JSON type: 0 is not false)."""

    def check(ctx: _Ctx, name: str, v: Any) -> None:
        if v is None or any(v == a and type(v) is type(a) for a in allowed):
            return
        raise _refuse(ctx, name, f"{name}: {why}")

    return check


def _string(ctx: _Ctx, name: str, v: Any) -> None:
    """An identifier (end user, cache key): nothing to do with it beyond echoing it."""
    if v is not None and not isinstance(v, str):
        raise _refuse(ctx, name, f"Invalid type for '{name}': expected a string.", "invalid_type")
    if v is not None and ctx.api == RESPONSES:
        ctx.served.echo[name] = v


def _parallel_tool_calls(ctx: _Ctx, name: str, v: Any) -> None:
    if v is not None and not isinstance(v, bool):
        raise _refuse(ctx, name, f"Invalid type for '{name}': expected a boolean.", "invalid_type")
    if v is False:
        ctx.served.single_call = True
        if ctx.api == RESPONSES:
            ctx.served.echo["parallel_tool_calls"] = False


def _max_tool_calls(ctx: _Ctx, name: str, v: Any) -> None:
    """A bound on calls of built-in tools: none is served, so every bound holds."""
    if v is None:
        return
    if not _is_int(v) or v < 1:
        raise _refuse(ctx, name, f"Invalid '{name}': expected an integer >= 1.")
    ctx.served.echo[name] = v


def _metadata(ctx: _Ctx, name: str, v: Any) -> None:
    """Responses echo it (with OpenAI's limits: 16 pairs, keys up to 64 characters, string
    values up to 512); Chat Completions would only store it, and nothing is stored."""
    if v is None or v == {}:
        return
    if ctx.api != RESPONSES:
        why = "not supported on Chat Completions, which stores nothing and reports nothing"
        raise _refuse(ctx, name, f"{name}: {why} (only {{}} or null)")
    ok = isinstance(v, dict) and len(v) <= 16
    ok = ok and all(len(k) <= 64 and isinstance(x, str) and len(x) <= 512 for k, x in v.items())
    if not ok:
        limits = "at most 16 pairs, keys of up to 64 characters, string values of up to 512"
        raise _refuse(ctx, name, f"Invalid '{name}': {limits}")
    ctx.served.echo[name] = v


def _previous_response_id(ctx: _Ctx, name: str, v: Any) -> None:
    # OpenAI's answer for an id it does not hold: this server holds none (store is off).
    if v is not None:
        raise _refuse(
            ctx, name, f"Previous response with id '{v}' not found.", "previous_response_not_found"
        )


def _conversation(ctx: _Ctx, name: str, v: Any) -> None:
    if v is not None:
        cid = v.get("id") if isinstance(v, dict) else v
        raise _refuse(ctx, name, f"Conversation with id '{cid}' not found.", "not_found")


def _verbosity(ctx: _Ctx, name: str, v: Any) -> None:
    if v not in (None, "medium"):
        why = "the served model has no verbosity control"
        raise _refuse(ctx, name, f"{name}: only 'medium' is supported: {why} (got {v!r})")


def _text(ctx: _Ctx, name: str, v: Any) -> None:
    # The recipe checks `format`; verbosity is a hint this model cannot take.
    if isinstance(v, dict):
        _verbosity(ctx, "text.verbosity", v.get("verbosity"))


_INCLUDE = frozenset({
    "message.output_text.logprobs",  # honoured (protocol.sampling)
    # Reasoning items carry their text in `content`, which a next request may send back (it is
    # read): what encrypted_content is for, without the encryption.
    "reasoning.encrypted_content",
    # Details of items of tools that are never served (refused in `tools`): nothing to include.
    "web_search_call.action.sources", "web_search_call.results", "code_interpreter_call.outputs",
    "computer_call_output.output.image_url", "file_search_call.results",
    "message.input_image.image_url",
})  # fmt: skip


def _include(ctx: _Ctx, name: str, v: Any) -> None:
    for x in v if isinstance(v, list) else ():  # its shape is protocol.sampling's to check
        if isinstance(x, str) and x not in _INCLUDE:
            raise _refuse(
                ctx, name, f"Invalid value for '{name}': {x!r} is not supported.", "invalid_value"
            )


def _stream_options(ctx: _Ctx, name: str, v: Any) -> None:
    # Responses: include_obfuscation (padding against length side channels) is never added.
    if v is not None and not isinstance(v, dict):
        raise _refuse(ctx, name, f"Invalid type for '{name}': expected an object.", "invalid_type")


def _modalities(ctx: _Ctx, name: str, v: Any) -> None:
    if v is not None and v != ["text"]:
        raise _refuse(ctx, name, f'{name}: only ["text"] is supported (no audio output)')


def _output_format(ctx: _Ctx, name: str, v: Any) -> None:
    """Anthropic's structured output (`output_format`, beta; `output_config.format`): enforced
    by the grammar machinery, as a json_schema response_format is."""
    if v is None:
        return
    schema = v.get("schema") if isinstance(v, dict) else None
    if not isinstance(v, dict) or v.get("type") != "json_schema" or not isinstance(schema, dict):
        raise _refuse(ctx, name, 'expected {"type": "json_schema", "schema": {...}}')
    if ctx.has_tools:
        why = "the output is either tool calls or the structured answer"
        raise _refuse(ctx, name, f"together with tools is not supported ({why})")
    ctx.served.output_schema = schema


def _output_config(ctx: _Ctx, name: str, v: Any) -> None:
    # The recipe reads `effort`; `format` is the GA spelling of output_format.
    if isinstance(v, dict) and v.get("format") is not None:
        _output_format(ctx, "output_config.format", v.get("format"))


def _thinking(ctx: _Ctx, name: str, v: Any) -> None:
    """thinking.budget_tokens (Anthropic's; the recipe reads Chat's too but ignores it): the
    reasoning gets at most that many tokens, then `</think>` is forced (engine side). The recipe
    has checked the object's shape."""
    budget = v.get("budget_tokens") if isinstance(v, dict) else None
    valid = isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0
    if valid and ctx.conv.conversation.thinking_mode:
        ctx.served.thinking_budget = min(budget, _MAX_BUDGET)


_MAX_BUDGET = 2**31 - 1  # beyond any max_tokens: the same as no budget
_NO_STORE = "this server stores nothing"
_SERVING = {
    CHAT: {
        "parallel_tool_calls": _parallel_tool_calls,
        "user": _string, "safety_identifier": _string, "prompt_cache_key": _string,
        "metadata": _metadata,
        "store": _only(False, why=f"only false: {_NO_STORE}"),
        "service_tier": _only("auto", "default", why="only 'auto' or 'default': one tier"),
        "prompt_cache_retention": _only(why="not supported: cached prefixes live by the "
                                            "server's TTLs (X-DeepRing-Cache-Class)"),
        "verbosity": _verbosity,
        "modalities": _modalities,
        "audio": _only(why="not supported: no audio output"),
        "prediction": _only(why="not supported: predicted outputs are not served"),
        "web_search_options": _only(why="not supported: no web search is served"),
        "functions": _only(why="not supported: use tools"),
        "function_call": _only(why="not supported: use tool_choice"),
        "thinking": _thinking,
    },
    RESPONSES: {
        "parallel_tool_calls": _parallel_tool_calls,
        "max_tool_calls": _max_tool_calls,
        "safety_identifier": _string, "prompt_cache_key": _string,
        "metadata": _metadata,
        "text": _text,
        "include": _include,
        "stream_options": _stream_options,
        "previous_response_id": _previous_response_id,
        "conversation": _conversation,
        "store": _only(False, why=f"only false: {_NO_STORE}"),
        "background": _only(False, why=f"only false: {_NO_STORE}, so a background response "
                                        "could not be retrieved"),
        "truncation": _only("disabled", why="only 'disabled': a prompt longer than the context "
                                            "is refused, never truncated"),
        "service_tier": _only("auto", "default", why="only 'auto' or 'default': one tier"),
        "prompt_cache_retention": _only(why="not supported: cached prefixes live by the "
                                            "server's TTLs (X-DeepRing-Cache-Class)"),
        "prompt": _only(why=f"not supported: {_NO_STORE} (no prompt templates)"),
    },
    MESSAGES: {
        "output_format": _output_format,
        "output_config": _output_config,
        "service_tier": _only("auto", "standard_only", why="only 'auto' or 'standard_only'"),
        "container": _only(why="not supported: no code execution is served"),
        "mcp_servers": _only([], why="not supported: no MCP connector is served"),
        "context_management": _only(why="not supported: the context is never edited"),
        "thinking": _thinking,
    },
}  # fmt: skip

# The fields each API knows, and those read from the body (sampling's and those checked here).
KNOWN = {api: _RECIPE[api] | set(SAMPLING_FIELDS[api]) | set(_SERVING[api]) for api in _RECIPE}
NAMES = {
    api: (*SAMPLING_FIELDS[api], *(n for n in _SERVING[api] if n not in SAMPLING_FIELDS[api]),
          *(("tool_choice",) if api == MESSAGES else ()))
    for api in _RECIPE
}  # fmt: skip


def outline(body: Any, api: str) -> tuple[list[str], frozenset[str], dict[str, Any]]:
    """The body's top-level keys, `type` tags and the fields NAMES[api] (request_outline)."""
    try:
        return request_outline(body, list(NAMES[api]))
    except ValueError as e:  # the recipe parsed this body already: cannot happen
        raise ApiError(400, str(e)) from None


def check(
    api: str,
    body: Any,
    conv: ConversationRequest,
    keys: list[str],
    tags: frozenset[str],
    got: dict[str, Any],
    no_images: str | None = nested.NO_IMAGES,
) -> Served:
    """Refuse (ApiError 400) the first unknown top-level field, then the first field whose
    value is not served, then nested content that is not (protocol.nested; no_images: why
    images are refused, None when they are served); return what serving must enforce. `keys`,
    `tags`, `got`: the body's outline."""
    known = KNOWN[api]
    for name in keys:
        if name not in known:
            raise _unknown(api, name)
    conversation = conv.conversation
    ctx = _Ctx(api, conv, bool(conversation.tools), Served())
    checks = _SERVING[api]
    for name, v in got.items():  # in the body's order
        if name in checks:
            checks[name](ctx, name, v)
    nested.check(api, body, conv, tags, no_images)
    if api == MESSAGES:
        _messages_tool_choice(ctx, got.get("tool_choice"))
    if not ctx.has_tools:
        ctx.served.single_call = False  # nothing to call: nothing to enforce
    return ctx.served


def _messages_tool_choice(ctx: _Ctx, choice: Any) -> None:
    """`any` must call a tool (the recipe turns it into auto, a known quirk of the official);
    `disable_parallel_tool_use` allows one call. Anthropic refuses forced tool use in thinking
    mode, as the recipe does for `tool`."""
    if not isinstance(choice, dict):
        return
    if choice.get("disable_parallel_tool_use") is True:
        ctx.served.single_call = True
    if choice.get("type") != "any":
        return
    if ctx.conv.conversation.thinking_mode:
        raise _refuse(
            ctx, "tool_choice", "Thinking may not be enabled when tool_choice forces tool use."
        )
    if not ctx.has_tools:
        raise _refuse(ctx, "tool_choice", "tool_choice any needs at least one tool")
    ctx.served.must_call = True


def responses_echo(served: Served, sampling: dict[str, Any]) -> dict[str, Any]:
    """ResponsesEcho.with_served keyword arguments: what the check recorded, and the penalties
    the sampler applies."""
    echo = dict(served.echo)
    for name in ("presence_penalty", "frequency_penalty"):
        if sampling.get(name):
            echo[name] = float(sampling[name])
    return echo


# ---- a body the recipe could not read ------------------------------------------------------------

_INTEGERS = {
    CHAT: ("max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs"),
    RESPONSES: ("max_output_tokens", "top_logprobs"),
    MESSAGES: ("max_tokens",),
}


def explain_parse_error(api: str, body: Any, message: str) -> ApiError:
    """A clearer 400 than serde's for what clients commonly send wrong, naming the field: a
    decimal where an integer goes (OpenAI refuses `16.0` too: "Invalid type for
    'max_output_tokens': expected an integer, but got a decimal number instead."). Otherwise
    the recipe's."""
    try:  # the body may not be JSON at all: then the recipe's message says so
        got = request_fields(body, list(_INTEGERS[api]))
    except (ValueError, TypeError, OverflowError, RecursionError):
        return ApiError(400, message)
    if "floating point" in message:
        for name in _INTEGERS[api]:
            if not isinstance(got.get(name), float):
                continue
            if api == MESSAGES:  # Anthropic's (pydantic's) words
                return ApiError(400, f"{name}: Input should be a valid integer")
            what = "expected an integer, but got a decimal number instead."
            return field_error(name, f"Invalid type for '{name}': {what}", "invalid_type")
    return ApiError(400, message)
