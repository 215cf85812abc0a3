"""Documented deviations (recipe/DEVIATIONS.md): `adjust_for_deviations` is the only place
that tolerates a difference between the two libraries."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from .common import json_text

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
# R5. Responses objects report `text.verbosity` as "medium" (OpenAI's default) when the request
#    sets none; the official writes null, which the Responses schema does not allow.
#    Adjustment: `verbosity_as_ours` reads the official's null as "medium" (streams only: the
#    request summaries do not hold the response object).
# R6. With token-id input `reasoning_tokens` is capped at the completion's tokens (the ids
#    generated); the official reports the reasoning text's re-encoded count even above them.
#    Adjustment: for token-id input, `reasoning_capped` caps the official's count in every
#    reduced usage (Chat `completion_tokens_details`, Responses `output_tokens_details`).


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


def verbosity_as_ours(value: Any) -> Any:
    """`value` (reduced stream output of the official) with every Responses text setting
    `{"format": ..., "verbosity": null}` reporting "medium", as ours does (R5)."""
    if isinstance(value, list):
        return [verbosity_as_ours(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: verbosity_as_ours(v) for k, v in value.items()}
    if "format" in out and "verbosity" in out and out["verbosity"] is None:
        out["verbosity"] = "medium"
    return out


def reasoning_capped(value: Any) -> Any:
    """`value` (reduced stream output of the official) with every usage's `reasoning_tokens`
    capped at its completion's tokens, as ours reports it (R6)."""
    if isinstance(value, list):
        return [reasoning_capped(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: reasoning_capped(v) for k, v in value.items()}
    for total, details in (
        ("completion_tokens", "completion_tokens_details"),
        ("output_tokens", "output_tokens_details"),
    ):
        d = out.get(details)
        if isinstance(out.get(total), int) and isinstance(d, dict):
            r = d.get("reasoning_tokens")
            if isinstance(r, int) and r > out[total]:
                out[details] = {**d, "reasoning_tokens": out[total]}
    return out
