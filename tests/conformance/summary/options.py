"""ConversionOptions from a plain-data spec, and ConversionOptions as data."""

from __future__ import annotations

from typing import Any

from .common import BEHAVIOURS, MODEL_VERSIONS, WEB_SEARCH, enum_name

# spec = {"ctor": {kwarg: value}, "with": [[method, *args], ...]} where enum values are given
# by name ("Reject", "Drop", "DeepseekV4Pro") and special tokens as {field: spelling}.


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
