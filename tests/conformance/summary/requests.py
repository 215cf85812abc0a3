"""The request pipeline (issue 3): `request_summary` and its label for histograms."""

from __future__ import annotations

import re
from typing import Any

from .common import MODEL_VERSIONS, REQUEST_CLASS, attempt, enum_name
from .conversion import (
    conversation_summary,
    image_summary,
    inference_summary,
    parsing_summary,
)
from .options import build_options, options_summary, special_token_overrides, special_tokens

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
