"""Pipeline helpers shared by the conformance tests and `selfcheck.py`.

Everything here takes the library module `M` as an argument (`deepring_recipe` or
`deepseek_recipe`) and reduces what `M` does to plain Python data (str, int, float, bool,
None, list, dict), so that the result of one module can be compared with the other's with
`==` and, type-strictly, through `canonical_json`.

Requests (issue 3): `request_summary(M, case, tokenizer)` runs
`<Proto>Request(body)` -> (Responses extras) -> `convert(options)` -> conversation,
inference and parsing options -> `resolve_max_tokens` -> V4 and V4.1 rendering and encoding.

Streams (issue 5): `run_stream(M, case, chunking, tokenizer)` converts the case's request,
pushes the chunking through `StreamProcessor` and reduces the events (see `reduce_events`).

Intentional deviations of deepring_recipe from the official library (recipe/DEVIATIONS.md)
are handled in exactly one place, `adjust_for_deviations`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from typing import Any

PROTOCOLS = ("chat", "responses", "messages")
REQUEST_CLASS = {
    "chat": "ChatCompletionRequest",
    "responses": "ResponsesRequest",
    "messages": "MessagesRequest",
}
RESPONSE_CLASS = {
    "chat": "ChatCompletionResponse",
    "responses": "ResponsesResponse",
    "messages": "MessagesResponse",
}
ENCODINGS = ("DeepseekV4Encoding", "DeepseekV41Encoding")

# (prompt_tokens, context_limit) pairs passed to ConversationRequest.resolve_max_tokens.
RESOLVE_SIZES = (
    (0, 1_048_576),
    (10, 8192),
    (1000, 65536),
    (8000, 8192),
    (8192, 8192),
    (9000, 8192),
    (100, 400_000),
)
# Only prompts shorter than this are encoded to ids (encoding is the slow part).
ENCODE_MAX_PROMPT_CHARS = 3000

SPECIAL_TOKEN_FIELDS = {
    "bos": "Bos",
    "eos": "Eos",
    "thinking_start": "ThinkingStart",
    "thinking_end": "ThinkingEnd",
    "system": "System",
    "user": "User",
    "assistant": "Assistant",
    "latest_reminder": "LatestReminder",
    "dsml": "Dsml",
    "image": "Image",
    "ref": "Ref",
    "ref_end": "RefEnd",
    "box": "Box",
    "box_end": "BoxEnd",
    "point": "Point",
    "point_end": "PointEnd",
    "polygon": "Polygon",
    "polygon_end": "PolygonEnd",
}


# ---------------------------------------------------------------------------------------------
# generic helpers


def canonical_json(value: Any) -> str:
    """Type-strict text of a summary: tells 1 from 1.0 from True, and keeps key order."""
    return json.dumps(value, ensure_ascii=False, allow_nan=True, default=repr)


def exc_summary(M: Any, exc: BaseException) -> dict:
    """An exception as data: its type name and message (+ status and body for ConversionError)."""
    if isinstance(exc, M.ConversionError):
        body: Any = getattr(exc, "body", None)
        with contextlib.suppress(TypeError, ValueError):
            body = json.loads(body)
        return {
            "error": "ConversionError",
            "status_code": getattr(exc, "status_code", None),
            "body": body,
            "message": str(exc),
        }
    return {"error": type(exc).__name__, "message": str(exc)}


def attempt(M: Any, fn, *args, **kwargs) -> tuple[bool, Any]:
    """(True, result) or (False, exc_summary) for the expected exception kinds."""
    try:
        return True, fn(*args, **kwargs)
    except (
        M.ConversionError,
        ValueError,
        TypeError,
        RuntimeError,
        OverflowError,
        RecursionError,
        UnicodeError,
        KeyError,
    ) as exc:
        return False, exc_summary(M, exc)


def enum_name(cls: Any, value: Any, names: tuple[str, ...]) -> str | None:
    """The attribute name under which `cls` holds `value` (enums compared by name)."""
    if value is None:
        return None
    for name in names:
        member = getattr(cls, name, None)
        if member is not None and (member is value or member == value):
            return name
    return f"<unknown {value!r}>"


MODEL_VERSIONS = ("DeepseekV4Pro", "DeepseekV41Flash")
STAGES = ("ReasoningStart", "ReasoningContinuation", "ContentContinuation")
BEHAVIOURS = ("FillEmpty", "Reject")
WEB_SEARCH = ("Drop", "Reject")
FINISH_REASONS = ("Stop", "Length", "ContentFilter")


def json_text(value: Any) -> str:
    """A JSON-ish property as text that keeps key order and JSON types."""
    return json.dumps(value, ensure_ascii=False, default=repr)


# ---------------------------------------------------------------------------------------------
# ConversionOptions from a plain-data spec
#
# spec = {"ctor": {kwarg: value}, "with": [[method, *args], ...]} where enum values are given
# by name ("Reject", "Drop", "DeepseekV4Pro") and special tokens as {field: spelling}.


def special_tokens(M: Any, overrides: dict[str, str]) -> Any:
    return M.SpecialTokens(**overrides)


def build_options(M: Any, spec: dict | None) -> Any:
    spec = spec or {}
    kwargs = {}
    for key, value in spec.get("ctor", {}).items():
        if key == "reasoning_content_behavior":
            value = getattr(M.ReasoningContentBehavior, value)
        elif key in ("responses_web_search", "messages_web_search"):
            value = getattr(M.WebSearchBehavior, value)
        kwargs[key] = value
    options = M.ConversionOptions(**kwargs)
    for step in spec.get("with", []):
        method, args = step[0], list(step[1:])
        if method == "reasoning_content_behavior":
            args = [getattr(M.ReasoningContentBehavior, args[0])]
        elif method in ("responses_web_search", "messages_web_search"):
            args = [getattr(M.WebSearchBehavior, args[0])]
        elif method == "special_tokens":
            args = [special_tokens(M, args[0])]
        elif method == "model_alias":
            args = [args[0], getattr(M.ModelVersion, args[1])]
        elif method == "model_versions_by_name":
            args = [{k: getattr(M.ModelVersion, v) for k, v in args[0].items()}]
        options = getattr(options, "with_" + method)(*args)
    return options


def special_token_overrides(spec: dict | None) -> dict[str, str]:
    """The special-token overrides a spec installs (the last `special_tokens` step wins)."""
    overrides: dict[str, str] = {}
    for step in (spec or {}).get("with", []):
        if step[0] == "special_tokens":
            overrides = dict(step[1])
    return overrides


def special_tokens_summary(M: Any, tokens: Any) -> dict[str, str]:
    return {
        name: tokens.token(getattr(M.SpecialToken, name)) for name in SPECIAL_TOKEN_FIELDS.values()
    }


def options_summary(M: Any, options: Any) -> dict:
    return {
        "default_thinking_mode": options.default_thinking_mode,
        "model_versions_by_name": sorted(
            (name, enum_name(M.ModelVersion, version, MODEL_VERSIONS))
            for name, version in options.model_versions_by_name.items()
        ),
        "thinking_max_tokens_upper_bound": options.thinking_max_tokens_upper_bound,
        "non_thinking_max_tokens_upper_bound": options.non_thinking_max_tokens_upper_bound,
        "reasoning_content_behavior": enum_name(
            M.ReasoningContentBehavior, options.reasoning_content_behavior, BEHAVIOURS
        ),
        "responses_web_search": enum_name(
            M.WebSearchBehavior, options.responses_web_search, WEB_SEARCH
        ),
        "messages_web_search": enum_name(
            M.WebSearchBehavior, options.messages_web_search, WEB_SEARCH
        ),
        "special_tokens": special_tokens_summary(M, options.special_tokens),
    }


# ---------------------------------------------------------------------------------------------
# conversation summaries


def image_summary(image: Any) -> dict:
    data = image.data
    return {
        "class": type(image).__name__,
        "kind": image.kind,
        "detail": image.detail,
        "url": image.url,
        "data_url": image.data_url,
        "data": None if data is None else bytes(data).hex(),
        "path": image.path,
    }


def tool_summary(tool: Any) -> dict:
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": json_text(tool.parameters),
        "strict": tool.strict,
        "defer_loading": tool.defer_loading,
    }


def message_summary(message: Any) -> dict:
    calls = message.tool_calls
    out = {
        "class": type(message).__name__,
        "role": message.role,
        "content": message.content,
        "reasoning_content": message.reasoning_content,
        "tool_calls": None if calls is None else [[c.id, c.name, c.arguments] for c in calls],
        "tool_call_id": message.tool_call_id,
        "prefix": message.prefix,
        "images": [image_summary(i) for i in message.image_sources],
    }
    if message.role == "system":
        tools = message.tools
        out["tools"] = None if tools is None else [tool_summary(t) for t in tools]
    return out


def conversation_summary(conversation: Any) -> dict:
    return {
        "messages": [message_summary(m) for m in conversation.messages],
        "thinking_mode": conversation.thinking_mode,
        "tools": [tool_summary(t) for t in conversation.tools],
        "tool_choice": conversation.tool_choice,
        "reasoning_effort": conversation.reasoning_effort,
        "response_format": conversation.response_format,
        "response_schema": json_text(conversation.response_schema),
        "response_regex": conversation.response_regex,
    }


def inference_summary(options: Any) -> dict:
    constraint = options.output_constraint
    return {
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "top_p": options.top_p,
        "logprobs": options.logprobs,
        "top_logprobs": options.top_logprobs,
        "seed": options.seed,
        "output_constraint": None
        if constraint is None
        else {"kind": constraint.kind, "schema": constraint.schema},
    }


def parsing_summary(M: Any, options: Any) -> dict:
    stage = options.thinking_initial_stage
    return {
        "parse_tool_calls": options.parse_tool_calls,
        "starts_in_tool_calls": options.starts_in_tool_calls,
        "parse_json_output": options.parse_json_output,
        "thinking_initial_stage": enum_name(M.ThinkingInitialStage, stage, STAGES),
        "starts_in_reasoning": None if stage is None else stage.starts_in_reasoning(),
        "stop_sequences": list(options.stop_sequences),
        "special_tokens": special_tokens_summary(M, options.special_tokens),
    }


_ENCODERS: dict[tuple, Any] = {}


def encoding_for(M: Any, name: str, overrides: dict[str, str], tokenizer: Any) -> tuple:
    """(encoding, encoding with the tokenizer attached), cached: `with_tokenizer` copies the
    tokenizer, which costs far more than rendering a prompt."""
    key = (M.__name__, name, tuple(sorted(overrides.items())), id(tokenizer))
    if key not in _ENCODERS:
        encoding = getattr(M, name)()
        if overrides:
            encoding = encoding.with_special_tokens(special_tokens(M, overrides))
        encoder = None if tokenizer is None else encoding.with_tokenizer(tokenizer)
        _ENCODERS[key] = (encoding, encoder, tokenizer)  # keeps the tokenizer id alive
    return _ENCODERS[key][:2]


def rendered_summary(M: Any, encodings: tuple, conversation: Any) -> dict:
    encoding, encoder = encodings
    ok, rendered = attempt(M, encoding.render_conversation, conversation)
    if not ok:
        return {"render_error": rendered}
    prompt = rendered.prompt
    out: dict[str, Any] = {
        "prompt": prompt,
        "special_ranges": [[int(a), int(b)] for a, b in rendered.special_ranges],
        "images": [image_summary(i) for i in rendered.image_sources],
    }
    if encoder is not None and len(prompt) <= ENCODE_MAX_PROMPT_CHARS:
        ok, ids = attempt(M, encoder.encode, conversation)
        out["ids"] = list(ids) if ok else ids
    return out


def request_summary(M: Any, case: dict, tokenizer: Any = None) -> dict:
    """Run the whole request pipeline of `case` on module `M` and reduce it to data.

    case = {"protocol": "chat"|"responses"|"messages", "body": dict|str|bytes, "options": spec}
    """
    protocol = case["protocol"]
    request_cls = getattr(M, REQUEST_CLASS[protocol])
    out: dict[str, Any] = {}
    options = build_options(M, case.get("options"))
    out["options"] = options_summary(M, options)
    ok, request = attempt(M, request_cls, case["body"])
    if not ok:
        out["construct"] = request
        return out
    out["model"] = attempt(M, lambda: request.model)[1]
    if protocol == "responses":
        ok, namespaces = attempt(M, request.namespace_tool_map, options)
        out["namespace_tool_map"] = (
            sorted([k, list(v)] for k, v in namespaces.items()) if ok else namespaces
        )
        ok, echo = attempt(M, request.echo)
        out["echo"] = (
            {
                "instructions": echo.instructions,
                "max_output_tokens": echo.max_output_tokens,
                "temperature": echo.temperature,
                "top_p": echo.top_p,
                "top_logprobs": echo.top_logprobs,
                "user": echo.user,
            }
            if ok
            else echo
        )
    ok, converted = attempt(M, request.convert, options)
    # a request is single-use: a second convert and `.model` report consumption
    out["reconvert"] = attempt(M, request.convert, options)[1]
    out["model_after"] = attempt(M, lambda: request.model)[1]
    if not ok:
        out["convert"] = converted
        return out
    conversation = converted.conversation
    out["conversation"] = conversation_summary(conversation)
    out["inference"] = inference_summary(converted.inference_options)
    out["parsing"] = parsing_summary(M, converted.parsing_options)
    out["model_version"] = enum_name(M.ModelVersion, converted.model_version, MODEL_VERSIONS)
    out["stream"] = converted.stream
    out["resolve_max_tokens"] = [
        attempt(M, converted.resolve_max_tokens, prompt, ctx)[1] for prompt, ctx in RESOLVE_SIZES
    ]
    overrides = special_token_overrides(case.get("options"))
    rendered = {}
    for name in ENCODINGS:
        encodings = encoding_for(M, name, {}, tokenizer)
        rendered[name] = rendered_summary(M, encodings, conversation)
        if overrides:
            encodings = encoding_for(M, name, overrides, tokenizer)
            rendered[name + "+special_tokens"] = rendered_summary(M, encodings, conversation)
    out["rendered"] = rendered
    return out


def outcome_label(summary: dict) -> str:
    """Short label of a request summary for histograms: ok / construct:<msg> / convert:<msg>."""
    for stage in ("construct", "convert"):
        if stage in summary:
            err = summary[stage]
            message = re.sub(r"\d+", "N", err["message"])
            message = re.sub(r"`[^`]*`|'[^']*'|\"[^\"]*\"", "_", message)
            return f"{stage}:{err['error']}:{message[:90]}"
    return "ok"


# ---------------------------------------------------------------------------------------------
# documented deviations (recipe/DEVIATIONS.md)
#
# 1. Chat `max_completion_tokens` is honoured by deepring_recipe and ignored by the official.
#    Adjustment: when a Chat body holds `max_completion_tokens`, `inference.max_tokens` and
#    `resolve_max_tokens` are left out of the comparison (the strategies only generate values
#    the official accepts as `max_tokens` too), and `check_deviation_expectations` checks
#    that ours uses the value when `max_tokens` is absent.
# 2. Strict normalisation keeps the `$defs` / `definitions` a kept `$ref` points to; the
#    official drops them. Adjustment: `$defs` / `definitions` are removed from every
#    strict-normalised schema on both sides (conversation tools with strict=True, the
#    output constraint), the tool-schema lines of the rendered prompts are rewritten the
#    same way (prompt + special ranges compared as segments), and prompt ids are not
#    compared for such requests.


def _body_dict(case: dict) -> dict | None:
    body = case["body"]
    if isinstance(body, dict):
        return body
    try:
        parsed = json.loads(body)
    except (ValueError, TypeError):
        return None
    return parsed if isinstance(parsed, dict) else None


def has_max_completion_tokens(case: dict) -> bool:
    body = _body_dict(case)
    return case["protocol"] == "chat" and body is not None and "max_completion_tokens" in body


def _mentions_defs(value: Any) -> bool:
    text = json.dumps(value, default=repr)
    return '"$defs"' in text or '"definitions"' in text


def strict_defs_deviation(case: dict) -> bool:
    """Whether a strict schema of the body holds `$defs`/`definitions` (deviation 2 may apply)."""
    body = _body_dict(case)
    if body is None:
        return False
    for tool in _iter_tools(body.get("tools")):
        if isinstance(tool, dict) and tool.get("strict") is True and _mentions_defs(tool):
            return True
    formats = []
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        formats.append(response_format.get("json_schema"))
    text = body.get("text")
    if isinstance(text, dict):
        formats.append(text.get("format"))
    return any(
        isinstance(f, dict) and f.get("strict") is True and _mentions_defs(f) for f in formats
    )


def _iter_tools(tools: Any):
    if not isinstance(tools, list):
        return
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if isinstance(tool.get("function"), dict):
            yield tool["function"]
        elif isinstance(tool.get("tools"), list):  # Responses namespace
            yield from _iter_tools(tool["tools"])
        else:
            yield tool


def strip_defs(schema: Any) -> Any:
    """Remove `$defs`/`definitions` keywords from a (normalised) schema, walking only schema
    positions: property *names* such as "definitions" are kept."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("$defs", "definitions"):
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: strip_defs(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = strip_defs(value)
        elif key == "anyOf" and isinstance(value, list):
            out[key] = [strip_defs(sub) for sub in value]
        else:
            out[key] = value
    return out


def _strip_tool_summary(tool: dict) -> None:
    if tool["strict"] is True:
        tool["parameters"] = json_text(strip_defs(json.loads(tool["parameters"])))


def _strip_constraint(constraint: dict | None) -> None:
    if constraint is None or not constraint["schema"]:
        return
    try:
        value = json.loads(constraint["schema"])
    except ValueError:
        return
    if constraint["kind"] == "json":
        value = strip_defs(value)
    elif constraint["kind"] in ("tool_call", "tool_call_required") and isinstance(value, list):
        for tool in value:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and function.get("strict") is True:
                function["parameters"] = strip_defs(function.get("parameters"))
    constraint["schema"] = json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_TOOL_LINE = re.compile(r'^\{"name": .*\}$')


def _normalise_tool_line(line: str, strict_names: set[str]) -> str:
    if not _TOOL_LINE.match(line):
        return line
    try:
        tool = json.loads(line)
    except ValueError:
        return line
    if not isinstance(tool, dict) or tool.get("name") not in strict_names:
        return line
    tool["parameters"] = strip_defs(tool.get("parameters"))
    return json.dumps(tool, ensure_ascii=False)


def prompt_segments(prompt: str, ranges: list[list[int]]) -> list[list]:
    """The prompt as [is_special, text] segments (a lossless view of prompt + ranges)."""
    out: list[list] = []
    pos = 0
    for start, end in ranges:
        if start > pos:
            out.append([False, prompt[pos:start]])
        out.append([True, prompt[start:end]])
        pos = max(pos, end)
    if pos < len(prompt):
        out.append([False, prompt[pos:]])
    return out


def _strip_rendered(rendered: dict, strict_names: set[str]) -> None:
    for entry in rendered.values():
        if "prompt" not in entry:
            continue
        segments = prompt_segments(entry.pop("prompt"), entry.pop("special_ranges"))
        for segment in segments:
            if not segment[0]:
                segment[1] = "\n".join(
                    _normalise_tool_line(line, strict_names) for line in segment[1].split("\n")
                )
        entry["segments"] = segments
        entry.pop("ids", None)


def _apply_defs_adjustment(summary: dict) -> None:
    conversation = summary.get("conversation")
    if conversation is None:
        return
    strict_names = set()
    for tool in conversation["tools"]:
        _strip_tool_summary(tool)
        if tool["strict"] is True:
            strict_names.add(tool["name"])
    for message in conversation["messages"]:
        for tool in message.get("tools") or []:
            _strip_tool_summary(tool)
            if tool["strict"] is True:
                strict_names.add(tool["name"])
    _strip_constraint(summary["inference"]["output_constraint"])
    _strip_rendered(summary["rendered"], strict_names)


def adjust_for_deviations(case: dict, ours: dict, official: dict) -> tuple[dict, dict]:
    """Copies of both summaries with the documented deviations factored out (see above)."""
    ours, official = copy.deepcopy(ours), copy.deepcopy(official)
    if has_max_completion_tokens(case):
        for summary in (ours, official):
            if "inference" in summary:
                summary["inference"]["max_tokens"] = "<deviation: max_completion_tokens>"
                summary["resolve_max_tokens"] = "<deviation: max_completion_tokens>"
    if strict_defs_deviation(case):
        for summary in (ours, official):
            _apply_defs_adjustment(summary)
    # R4: with several unanswered calls the official names a random one.
    errors = [s.get("convert") for s in (ours, official)]
    if all(isinstance(e, dict) and UNANSWERED.fullmatch(str(e.get("message"))) for e in errors):
        for summary in (ours, official):
            summary["convert"] = _mask_unanswered(summary["convert"])
    return ours, official


UNANSWERED = re.compile(r"No tool output found for tool call .*\.", re.S)


def _mask_unanswered(value: Any) -> Any:
    if isinstance(value, str):
        return UNANSWERED.sub("No tool output found for tool call <id>.", value)
    if isinstance(value, dict):
        return {k: _mask_unanswered(v) for k, v in value.items()}
    return value


def check_deviation_expectations(case: dict, ours: dict) -> None:
    """What the deviations promise for ours (run only on deepring_recipe)."""
    body = _body_dict(case)
    if (
        has_max_completion_tokens(case)
        and "inference" in ours
        and body is not None
        and body.get("max_tokens") is None
        and type(body["max_completion_tokens"]) is int
    ):
        assert ours["inference"]["max_tokens"] == body["max_completion_tokens"], (
            "deviation 1: Chat max_completion_tokens must be honoured"
        )


# ---------------------------------------------------------------------------------------------
# streams

# `call_NN_` + 24 random alphanumerics (the official's last 4 are always digits); a call that
# opens the reasoning itself (no reasoning text before the DSML block) gets `call_NN_ET_...`.
CALL_ID = re.compile(r"^call_(\d{2})_(ET_)?[A-Za-z0-9]{24}$")
TIMESTAMP_KEYS = ("created", "created_at", "completed_at")


class Normaliser:
    """Replaces random call ids by their shape and wall-clock timestamps by "<ts>", checking
    that each call index keeps one id throughout a response."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}
        self.problems: list[str] = []

    def __call__(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {k: self(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        if key in TIMESTAMP_KEYS and isinstance(value, int) and not isinstance(value, bool):
            return "<ts>"
        if isinstance(value, str) and value.startswith("call_"):
            match = CALL_ID.match(value)
            if match is None:
                self.problems.append(f"call id of unexpected shape: {value!r}")
                return value
            index, marker = match.group(1), match.group(2) or ""
            if self.ids.setdefault(index, value) != value:
                self.problems.append(f"call index {index} has two ids")
            return f"call_{index}_{marker}<id>"
        return value


def strip_usage(value: Any) -> Any:
    """Replace every non-null `usage` object by a marker (token counts depend on how far a
    stream got before a stop sequence, and on text vs token-id input)."""
    if isinstance(value, dict):
        return {
            k: ("<usage>" if k == "usage" and v is not None else strip_usage(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [strip_usage(v) for v in value]
    return value


def strip_logprobs(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ("<logprobs>" if k == "logprobs" else strip_logprobs(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [strip_logprobs(v) for v in value]
    return value


def build_chunks(M: Any, chunking: dict) -> list:
    """InferenceChunks of a chunking: {"mode": "text", "pieces": [[text, token_count], ...]}
    or {"mode": "tokens", "groups": [[ids, logprobs|None], ...]}."""
    if chunking["mode"] == "text":
        return [M.InferenceChunk.text(text, count) for text, count in chunking["pieces"]]
    chunks = []
    for ids, logprobs in chunking["groups"]:
        if logprobs is None:
            chunks.append(M.InferenceChunk.tokens(ids))
        else:
            chunks.append(
                M.InferenceChunk.tokens(
                    ids, [(lp, [tuple(t) for t in top]) for lp, top in logprobs]
                )
            )
    return chunks


def make_generator(M: Any, case: dict, request: Any, converted: Any, extras: dict) -> Any:
    protocol = case["protocol"]
    cls = getattr(M, REQUEST_CLASS[protocol])
    generator = cls.chunk_generator(converted, "resp_1", "model-x")
    if protocol == "responses":
        generator = generator.with_namespace_tool_map(extras["namespaces"])
        generator = generator.with_echo(extras["echo"])
    elif protocol == "messages" and case.get("signature") is not None:
        generator = generator.with_signature(case["signature"])
    return generator


def run_stream(M: Any, case: dict, chunking: dict, tokenizer: Any = None) -> dict:
    """Convert the case's request, stream `chunking` through the processor and reduce it.

    case = {"protocol", "body", "options": spec, "ready": bool, "finish": "Stop"|...,
            "signature": str|None, "stop_override": [str]|None}
    """
    protocol = case["protocol"]
    request = getattr(M, REQUEST_CLASS[protocol])(case["body"])
    options = build_options(M, case.get("options"))
    extras = {}
    if protocol == "responses":
        extras["namespaces"] = request.namespace_tool_map(options)
        extras["echo"] = request.echo()
    converted = request.convert(options)
    parsing = converted.parsing_options
    if case.get("stop_override") is not None:
        parsing.stop_sequences = case["stop_override"]
    generator = make_generator(M, case, request, converted, extras)
    processor = M.StreamProcessor(generator, parsing, tokenizer)
    events: list = []
    pushed = 0
    stopped_early = False
    error = None
    try:
        if case.get("ready", True):
            events += processor.push(
                M.InferenceChunk.ready(
                    prompt_usage=M.PromptUsage(prompt_tokens=10, prompt_cache_hit_tokens=3),
                    system_fingerprint="fp_x",
                )
            )
        for chunk in build_chunks(M, chunking):
            if processor.finished:
                stopped_early = True
                break
            events += processor.push(chunk)
            pushed += 1
        if not processor.finished:
            reason = getattr(M.InferenceFinishReason, case.get("finish", "Stop"))
            events += processor.push(M.InferenceChunk.finish(reason))
        else:
            stopped_early = True
        events += processor.finish()
        again = processor.finish()
        finished = processor.finished
    except RuntimeError as exc:
        error = exc_summary(M, exc)
        again, finished = [], None
    after_finish = attempt(M, processor.push, M.InferenceChunk.text("x", 1))
    return reduce_events(M, protocol, events) | {
        "parsing": parsing_summary(M, parsing),
        "error": error,
        "stopped_early": stopped_early,
        "finished": finished,
        "finish_again": len(again),
        "push_after_finish": after_finish[1] if not after_finish[0] else "<accepted>",
    }


def _event_data(events: list) -> list[dict]:
    return [json.loads(e.to_json()) for e in events]


def reduce_events(M: Any, protocol: str, events: list) -> dict:
    """The chunking-independent view of one protocol stream.

    - "text": concatenated reasoning / content deltas, tool calls (index, name, concatenated
      argument fragments), finish reason, usage, stop sequence, logprobs;
    - "events": the event list with consecutive deltas of the same block merged, empty
      deltas dropped and Responses sequence numbers renumbered (each entry is [sse name, data]);
    - "accumulated": the non-streaming response accumulated from every event;
    - "problems": per-event invariants that failed (SSE names, sequence numbers, id shapes).
    """
    response_cls = getattr(M, RESPONSE_CLASS[protocol])
    normalise = Normaliser()
    names = [response_cls.sse_event_name(e) for e in events]
    data = _event_data(events)
    problems: list[str] = []
    for name, item in zip(names, data, strict=True):
        expected = None if protocol == "chat" else item.get("type")
        if name != expected:
            problems.append(f"sse name {name!r} for event of type {item.get('type')!r}")
    if protocol == "responses":
        numbers = [item.get("sequence_number") for item in data]
        if numbers != list(range(len(numbers))):
            problems.append(f"sequence numbers {numbers}")
    accumulated = response_cls("resp_1", "model-x", 0, 10, 3)
    for event in events:
        accumulated.accumulate(event)
    data = normalise(data)
    reducer = {"chat": _reduce_chat, "responses": _reduce_responses, "messages": _reduce_messages}
    text = reducer[protocol](data)
    merged = merge_deltas(protocol, list(zip(names, data, strict=True)))
    out = {
        "text": text,
        "events": merged,
        "accumulated": normalise(json.loads(accumulated.to_json())),
        "sse_done_data": response_cls.sse_done_data(),
        "problems": problems + normalise.problems,
    }
    return out


def _reduce_chat(data: list[dict]) -> dict:
    reasoning, content, calls = [], [], {}
    finish, usage, logprobs, fingerprints, roles = None, None, [], [], []
    for chunk in data:
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        if chunk.get("system_fingerprint") not in fingerprints:
            fingerprints.append(chunk.get("system_fingerprint"))
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            if "role" in delta:
                roles.append(delta["role"])
            if isinstance(delta.get("reasoning_content"), str):
                reasoning.append(delta["reasoning_content"])
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(
                    call.get("index"), {"id": None, "type": None, "name": None, "arguments": []}
                )
                if "id" in call:
                    entry["id"] = call["id"]
                    entry["type"] = call.get("type")
                function = call.get("function", {})
                if "name" in function:
                    entry["name"] = function["name"]
                entry["arguments"].append(function.get("arguments", ""))
            if choice.get("finish_reason") is not None:
                finish = choice["finish_reason"]
            if choice.get("logprobs") is not None:
                logprobs.extend(choice["logprobs"].get("content") or [])
    return {
        "roles": roles,
        "reasoning": "".join(reasoning),
        "content": "".join(content),
        "tool_calls": [
            [index, c["id"], c["type"], c["name"], "".join(c["arguments"])]
            for index, c in sorted(calls.items(), key=lambda kv: str(kv[0]))
        ],
        "finish_reason": finish,
        "usage": usage,
        "system_fingerprints": fingerprints,
        "logprobs": logprobs,
    }


def _reduce_responses(data: list[dict]) -> dict:
    items: dict[int, dict] = {}
    terminal, usage, logprobs = None, None, []
    for event in data:
        kind = event.get("type", "")
        index = event.get("output_index")
        if kind == "response.output_item.added":
            item = event["item"]
            items[index] = {
                "type": item.get("type"),
                "name": item.get("name"),
                "namespace": item.get("namespace"),
                "call_id": item.get("call_id"),
                "text": [],
            }
        elif kind.endswith(".delta") and index in items:
            items[index]["text"].append(event.get("delta", ""))
            logprobs.extend(event.get("logprobs") or [])
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            terminal = [
                kind,
                event["response"].get("status"),
                event["response"].get("incomplete_details"),
            ]
            usage = event["response"].get("usage")
    return {
        "items": [
            [index, i["type"], i["name"], i["namespace"], i["call_id"], "".join(i["text"])]
            for index, i in sorted(items.items())
        ],
        "terminal": terminal,
        "usage": usage,
        "logprobs": logprobs,
    }


def _reduce_messages(data: list[dict]) -> dict:
    blocks: dict[int, dict] = {}
    stop, usage = None, None
    for event in data:
        kind = event.get("type")
        if kind == "content_block_start":
            block = event["content_block"]
            blocks[event["index"]] = {
                "type": block.get("type"),
                "name": block.get("name"),
                "id": block.get("id"),
                "text": [],
                "signature": [],
            }
        elif kind == "content_block_delta" and event.get("index") in blocks:
            delta = event["delta"]
            entry = blocks[event["index"]]
            for field in ("thinking", "text", "partial_json"):
                if field in delta:
                    entry["text"].append(delta[field])
            if "signature" in delta:
                entry["signature"].append(delta["signature"])
        elif kind == "message_delta":
            stop = [event["delta"].get("stop_reason"), event["delta"].get("stop_sequence")]
            usage = event.get("usage")
    return {
        "blocks": [
            [index, b["type"], b["name"], b["id"], "".join(b["text"]), "".join(b["signature"])]
            for index, b in sorted(blocks.items())
        ],
        "stop": stop,
        "usage": usage,
    }


# --- merging consecutive deltas ---------------------------------------------------------------


def _chat_delta_key(chunk: dict) -> tuple | None:
    """Merge key of a Chat chunk that only carries text or argument fragments, else None."""
    if chunk.get("usage") is not None or len(chunk.get("choices", [])) != 1:
        return None
    choice = chunk["choices"][0]
    if choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta", {})
    if "role" in delta:
        return None
    rest = {k: v for k, v in chunk.items() if k != "choices"}
    envelope = json.dumps(rest, sort_keys=True)
    keys = tuple(sorted(delta))
    if isinstance(delta.get("tool_calls"), list):
        calls = delta["tool_calls"]
        if len(calls) != 1 or "id" in calls[0] or set(calls[0]) != {"index", "function"}:
            return None
        if set(calls[0]["function"]) != {"arguments"}:
            return None
        return ("args", calls[0]["index"], keys, envelope)
    if isinstance(delta.get("reasoning_content"), str) and delta.get("content") is None:
        return ("reasoning", keys, envelope)
    if isinstance(delta.get("content"), str) and delta.get("reasoning_content") is None:
        return ("content", keys, envelope)
    return None


def _chat_text(chunk: dict) -> str:
    delta = chunk["choices"][0]["delta"]
    if "tool_calls" in delta:
        return delta["tool_calls"][0]["function"]["arguments"]
    if isinstance(delta.get("reasoning_content"), str) and delta.get("content") is None:
        return delta["reasoning_content"]
    return delta["content"]


def _chat_set_text(chunk: dict, text: str) -> None:
    delta = chunk["choices"][0]["delta"]
    if "tool_calls" in delta:
        delta["tool_calls"][0]["function"]["arguments"] = text
    elif isinstance(delta.get("reasoning_content"), str) and delta.get("content") is None:
        delta["reasoning_content"] = text
    else:
        delta["content"] = text


def _chat_merge(a: dict, b: dict) -> None:
    _chat_set_text(a, _chat_text(a) + _chat_text(b))
    la, lb = a["choices"][0].get("logprobs"), b["choices"][0].get("logprobs")
    if la is not None or lb is not None:
        # Per field: reasoning deltas carry `reasoning_content` log probabilities.
        merged: dict = {}
        for part in (la or {}, lb or {}):
            for key, entries in part.items():
                merged.setdefault(key, []).extend(entries or [])
        a["choices"][0]["logprobs"] = merged


DELTA_FIELD = {
    "response.reasoning_text.delta": "delta",
    "response.output_text.delta": "delta",
    "response.function_call_arguments.delta": "delta",
    "response.custom_tool_call_input.delta": "delta",
}


def _responses_key(event: dict) -> tuple | None:
    kind = event.get("type")
    if kind not in DELTA_FIELD:
        return None
    rest = {k: v for k, v in event.items() if k not in ("delta", "sequence_number", "logprobs")}
    return (kind, json.dumps(rest, sort_keys=True))


def _messages_key(event: dict) -> tuple | None:
    if event.get("type") != "content_block_delta":
        return None
    delta = event.get("delta", {})
    kind = delta.get("type")
    if kind not in ("thinking_delta", "text_delta", "input_json_delta"):
        return None
    return (event.get("index"), kind)


MESSAGES_FIELD = {
    "thinking_delta": "thinking",
    "text_delta": "text",
    "input_json_delta": "partial_json",
}


def merge_deltas(protocol: str, events: list[tuple[Any, dict]]) -> list[list]:
    """Merge consecutive deltas of one block, drop empty deltas, renumber Responses events."""
    out: list[list] = []
    last_key = None
    for name, original in events:
        event = copy.deepcopy(original)
        if protocol == "chat":
            key = _chat_delta_key(event)
            if (
                key is not None
                and _chat_text(event) == ""
                and (event["choices"][0].get("logprobs") is None)
            ):
                continue
            if key is not None and key == last_key:
                _chat_merge(out[-1][1], event)
                continue
        elif protocol == "responses":
            key = _responses_key(event)
            if key is not None and event.get("delta", "") == "" and not event.get("logprobs"):
                continue
            if key is not None and key == last_key:
                prev = out[-1][1]
                prev["delta"] += event["delta"]
                if "logprobs" in prev or "logprobs" in event:
                    prev["logprobs"] = (prev.get("logprobs") or []) + (event.get("logprobs") or [])
                continue
        else:
            key = _messages_key(event)
            if key is not None:
                field = MESSAGES_FIELD[key[1]]
                if event["delta"].get(field, "") == "":
                    continue
                if key == last_key:
                    out[-1][1]["delta"][field] += event["delta"][field]
                    continue
        out.append([name, event])
        last_key = key
    if protocol == "responses":
        for index, (_, event) in enumerate(out):
            if "sequence_number" in event:
                event["sequence_number"] = index
    return out


def stream_view(result: dict, *, keep_usage: bool, keep_logprobs: bool) -> dict:
    """The part of a `run_stream` result that must not depend on the chunking."""
    keys = (
        "parsing",
        "text",
        "events",
        "accumulated",
        "error",
        "problems",
        "finished",
        "push_after_finish",
    )
    view = {k: result[k] for k in keys}
    if not keep_usage:
        view = strip_usage(view)
    if not keep_logprobs:
        view = strip_logprobs(view)
    return view


# --- running one stream case under several chunkings -------------------------------------------


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class ByteTokens:
    """Explodes token ids into single-byte tokens (the byte-level BPE alphabet) while keeping
    added tokens (the special tokens) as they are: the ids a model could emit for the same text
    if every multi-byte character and every word were split into bytes. The official processor
    matches `</think>` and `｜DSML｜` only as special token ids in token input, so special tokens
    must stay whole for token input to mean the same as text input."""

    def __init__(self, tokenizer_json: str) -> None:
        with open(tokenizer_json, encoding="utf-8") as handle:
            data = json.load(handle)
        printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        alphabet: dict[int, str] = {b: chr(b) for b in printable}
        shift = 0
        for b in range(256):
            if b not in alphabet:
                alphabet[b] = chr(256 + shift)
                shift += 1
        vocab = data["model"]["vocab"]
        self.byte_id = [vocab[alphabet[b]] for b in range(256)]
        decode = {char: b for b, char in alphabet.items()}
        self.bytes_of = {
            i: bytes(decode[c] for c in token)
            for token, i in vocab.items()
            if all(c in decode for c in token)
        }
        self.added = {t["id"] for t in data["added_tokens"]}
        for token in data["added_tokens"]:
            self.bytes_of[token["id"]] = token["content"].encode()

    def silent_tail(self, ids: list[int]) -> bool:
        """Whether the ids end with tokens that produce no text: an id the tokenizer does not
        know, or bytes the decoder still holds at the end (as the official decoder holds them:
        the bytes of a token that is not valid UTF-8 on its own wait for the tokens that
        complete them, and become U+FFFD when a token valid on its own arrives first)."""
        known = [i for i in ids if self.bytes_of.get(i)]
        if ids and (not known or known[-1] != ids[-1]):
            return True
        pending = b""
        for i in ids:
            data = self.bytes_of.get(i, b"")
            if not data:
                continue
            if _valid_utf8(data):
                pending = b""
            else:
                pending += data
                if _valid_utf8(pending):
                    pending = b""
        return bool(pending)

    def explode(self, ids: list[int]) -> list[int]:
        out: list[int] = []
        for i in ids:
            if i in self.added or i not in self.bytes_of:
                out.append(i)
            else:
                out.extend(self.byte_id[b] for b in self.bytes_of[i])
        return out


def collapse_spaces(value: Any) -> Any:
    """Every run of spaces in every string reduced to one space."""
    if isinstance(value, dict):
        return {k: collapse_spaces(v) for k, v in value.items()}
    if isinstance(value, list):
        return [collapse_spaces(v) for v in value]
    if isinstance(value, str):
        return re.sub(" {2,}", " ", value)
    return value


def invariance_problems(
    results: list[tuple[dict, dict, str]], *, json_mode: bool = False, cross_input: bool = True
) -> list[str]:
    """Differences between the runs of one output under different chunkings.

    `results` holds (plan, run_stream result, usage class) with the "whole" text chunking
    first. Runs of one usage class must agree on everything (usage too, unless a stop sequence
    ended either run before the finish chunk); all runs of one input kind (text / token ids)
    must agree on everything but usage and logprobs. Text and token-id runs must agree on the
    reduced text (deltas, tool calls, finish) when `cross_input` (false under special-token
    overrides: token input matches markers only as special token ids), up to trailing
    newlines of each text: the official keeps one newline that follows a partial marker and
    precedes the real one in text input (`a<\\n\\n</think>` -> reasoning `a<\\n`) and drops it
    in token input (`a<`).

    Known chunking dependence of the official (see README): in JSON output mode the text
    around the JSON becomes one space *per pushed chunk*; `json_mode` compares with runs of
    spaces collapsed.
    """

    def view(result: dict, keep_usage: bool, keep_logprobs: bool) -> str:
        out = stream_view(result, keep_usage=keep_usage, keep_logprobs=keep_logprobs)
        return canonical_json(collapse_spaces(out) if json_mode else out)

    def cross_view(result: dict) -> str:
        out = strip_logprobs(strip_usage(result["text"]))
        out = canonical_json(collapse_spaces(out) if json_mode else out)
        return re.sub(r'(\\n)+"', '"', out)  # trailing newlines of every text

    problems = []
    first_of_class: dict[str, tuple[dict, dict]] = {}
    first_of_input: dict[str, tuple[dict, dict]] = {}
    base_plan, base, _ = results[0]
    for plan, result, klass in results:
        kind = "text" if klass == "text" else "ids"
        refs = []
        if klass in first_of_class:
            refs.append((*first_of_class[klass], True))
        else:
            first_of_class[klass] = (plan, result)
        if kind in first_of_input:
            refs.append((*first_of_input[kind], False))
        else:
            first_of_input[kind] = (plan, result)
        for ref_plan, ref, same_class in refs:
            keep = same_class and not (ref["stopped_early"] or result["stopped_early"])
            if view(ref, keep, same_class) != view(result, keep, same_class):
                problems.append(f"{plan} differs from {ref_plan}")
        if cross_input and kind != "text" and cross_view(base) != cross_view(result):
            problems.append(f"{plan} (token ids) differs from {base_plan} (text)")
    return problems


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two summaries first differ (for readable assertion messages)."""
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{path}.{key}: present only in one ({a.get(key)!r} / {b.get(key)!r})"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        if list(a) != list(b):
            return f"{path}: key order {list(a)} != {list(b)}"
        return None
    if isinstance(a, list):
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{index}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        return None
    if a != b or repr(a) != repr(b):
        return f"{path}: {a!r} != {b!r}"
    return None
