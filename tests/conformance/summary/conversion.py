"""What a conversion gives (conversation, inference and parsing options) as data."""

from __future__ import annotations

from typing import Any

from .common import STAGES, enum_name, json_text
from .options import special_tokens_summary


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
