"""Chat Completions bodies."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .context import Ctx
from .fields import (
    max_token_value,
    model_name,
    response_format_spec,
    sampling_options,
    stop_value,
    thinking_is_off,
    tool_choice_mode,
)
from .images import PNG_HEADER, image_url_of
from .schemas import tool_specs
from .script import conversation_script


def chat_part(ctx: Ctx, part: tuple) -> dict:
    if part[0] == "text":
        return {"type": "text", "text": part[1]}
    if part[0] == "image":
        spec = part[1]
        if ctx.fault("file", 50):
            return {"type": "file", "file_data": image_url_of(spec)}
        image_url: dict[str, Any] = {"url": image_url_of(spec)}
        if "detail" in spec:
            image_url["detail"] = spec["detail"]
        return {"type": "image_url", "image_url": image_url}
    if ctx.fault("file", 80):
        return ctx.pick(
            [
                {"type": "file", "file_id": "file-1"},
                {"type": "file", "file": {"file_id": "file-1"}},
                {"type": "file", "file_data": "xx"},
                {"type": "file", "file_data": "data:application/pdf;base64,aGk="},
            ]
        )
    return {"type": "file", "file_data": f"data:image/png;base64,{PNG_HEADER}"}


def chat_content(ctx: Ctx, parts: list[tuple]) -> Any:
    if len(parts) == 1 and parts[0][0] == "text" and not ctx.chance(30):
        return parts[0][1]
    return [chat_part(ctx, p) for p in parts]


def chat_messages(ctx: Ctx, script: list[dict]) -> list[dict]:
    messages: list[dict] = []
    for turn in script:
        kind = turn["kind"]
        if kind == "system":
            role = "developer" if ctx.fault("role", 60) else "system"
            messages.append({"role": role, "content": chat_content(ctx, turn["parts"])})
        elif kind == "user":
            message: dict[str, Any] = {"role": "user", "content": chat_content(ctx, turn["parts"])}
            if ctx.chance(10):
                message["name"] = "alice"
            messages.append(message)
        elif kind == "reminder":
            messages.append({"role": "latest_reminder", "content": turn["text"]})
        elif kind == "assistant":
            message = {"role": "assistant"}
            content = turn["content"]
            if turn["calls"] and content == "" and ctx.chance(50):
                message["content"] = None
            elif ctx.chance(20):
                message["content"] = [{"type": "text", "text": content}]
            else:
                message["content"] = content
            if turn["reasoning"] is not None or ctx.chance(20):
                message["reasoning_content"] = turn["reasoning"]
            if turn["calls"]:
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["args"]},
                    }
                    for c in turn["calls"]
                ]
            if turn["prefix"] or ctx.chance(10):
                message["prefix"] = turn["prefix"]
            messages.append(message)
        elif kind == "results":
            for result in turn["results"]:
                content = chat_content(ctx, result["parts"])
                messages.append({"role": "tool", "tool_call_id": result["id"], "content": content})
    if ctx.fault("prefix", 80) and messages:
        target = ctx.pick(messages)
        target["prefix"] = True
    return messages


def chat_tool(tool: dict) -> dict:
    function: dict[str, Any] = {"name": tool["name"]}
    if "description" in tool:
        function["description"] = tool["description"]
    if "parameters" in tool:
        function["parameters"] = tool["parameters"]
    if tool["strict"] is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def chat_response_format(spec: dict) -> dict:
    if spec["type"] == "regex":
        return {"type": "regex", "regex": spec["regex"]}
    if spec["type"] != "json_schema":
        return {"type": spec["type"]}
    inner = {k: v for k, v in spec.items() if k != "type"}
    return {"type": "json_schema", "json_schema": inner}


def chat_body(ctx: Ctx) -> dict:
    draw = ctx.draw
    tools = tool_specs(ctx) if ctx.chance(60) else []
    names = [t["name"] for t in tools]
    # a prefix continuation is a 400 with tools ("Function call should not be used with prefix")
    script = conversation_script(ctx, names, prefix=not tools or "prefix" in ctx.faults)
    has_prefix = any(t.get("prefix") for t in script)
    body: dict[str, Any] = {"model": model_name(ctx), "messages": chat_messages(ctx, script)}
    switch = effort = None
    if ctx.chance(30):
        switch = ctx.pick_faulty(
            "enum", ["enabled", "disabled", "adaptive", "disabled"], ["auto", "off"]
        )
        body["thinking"] = {"type": switch}
    if ctx.chance(30):
        effort = ctx.pick_faulty(
            "enum",
            ["high", "none", "none", "minimal", "low", "medium", "xhigh", "ultra", "max"],
            ["bogus", "HIGH"],
        )
        body["reasoning_effort"] = effort
    thinking_off = thinking_is_off(ctx, switch, effort)
    if tools:
        body["tools"] = [chat_tool(t) for t in tools]
    choice = tool_choice_mode(ctx, thinking_off, names)
    if choice is not None:
        body["tool_choice"] = (
            {"type": "function", "function": {"name": choice[1]}}
            if choice[0] == "named"
            else choice[0]
        )
    sampling_options(ctx, body)
    if ctx.chance(25):
        body["max_tokens"] = max_token_value(ctx)
    if ctx.chance(15):
        # deviation 1: honoured by deepring_recipe, ignored by the official; always within the
        # bounds, which are at least 4096
        body["max_completion_tokens"] = draw(st.integers(1, 4096))
    if ctx.chance(10) or "n" in ctx.faults:
        body["n"] = ctx.pick_faulty("n", [1], [2, 0])
    logprobs = ctx.chance(20)
    if logprobs or ctx.chance(10):
        body["logprobs"] = logprobs
    if (logprobs and ctx.chance(50)) or "logprobs" in ctx.faults:
        body["top_logprobs"] = ctx.pick_faulty("logprobs", [0, 1, 5, 20], [21, -1])
    if ctx.chance(10) or "seed" in ctx.faults:
        body["seed"] = ctx.pick_faulty("seed", [7, 0, 2**63 - 1], [2**63, 2**64 - 1, -1])
    if ctx.chance(20) or "stop" in ctx.faults:
        body["stop"] = stop_value(ctx, allow_string=True)
    if ctx.chance(10) or "penalty" in ctx.faults:
        body["frequency_penalty"] = ctx.pick_faulty("penalty", [0, -2, 2, 1.5], [2.5, -3])
    if ctx.chance(10):
        body["presence_penalty"] = ctx.pick([0, 1, -1])
        body["logit_bias"] = {"50256": -100}
        body["parallel_tool_calls"] = ctx.pick([True, False])
    stream = ctx.chance(30)
    if stream or ctx.chance(10):
        body["stream"] = stream
    if (stream and ctx.chance(30)) or ctx.fault("stream_options"):
        body["stream_options"] = {"include_usage": ctx.pick([True, False])}
    spec = response_format_spec(ctx, tools) if ctx.chance(30) else None
    if spec is not None and spec["type"] == "json_object" and has_prefix:
        spec = None if "prefix" not in ctx.faults else spec  # json_object + prefix is a 400
    if spec is not None:
        body["response_format"] = chat_response_format(spec)
        if spec["type"] == "json_object" and ctx.json_hint:
            body["messages"].insert(0, {"role": "system", "content": "Reply in JSON."})
    if ctx.chance(10):
        body["user"] = "user-1"
        body["unknown_field"] = {"x": [1]}
    return body
