"""Messages bodies."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from .context import Ctx
from .fields import (
    max_token_value,
    model_name,
    sampling_options,
    stop_value,
    thinking_is_off,
    tool_choice_mode,
)
from .images import image_url_of
from .schemas import tool_specs
from .script import conversation_script
from .values import texts


def messages_image_block(spec: dict) -> dict:
    kind = spec["kind"]
    if "data" in spec:
        source = {"type": "base64", "media_type": spec["mime"], "data": spec["data"]}
    elif kind == "file_id":
        source = {"type": "file", "file_id": "file-1"}
    else:
        source = {"type": "url", "url": image_url_of(spec)}
    return {"type": "image", "source": source}


DOCUMENTS = [
    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "D"}},
    {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "aGk="},
    },
]
BAD_BLOCKS = [
    {"type": "redacted_thinking", "data": "x"},
    {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
    {"type": "web_search_tool_result", "tool_use_id": "s", "content": []},
    {"type": "search_result", "source": "s", "title": "t", "content": []},
]


def messages_blocks(ctx: Ctx, parts: list[tuple]) -> Any:
    if len(parts) == 1 and parts[0][0] == "text" and not ctx.chance(40):
        return parts[0][1]
    out = []
    for part in parts:
        if part[0] == "text":
            block: dict[str, Any] = {"type": "text", "text": part[1]}
            if ctx.chance(10):
                block["cache_control"] = {"type": "ephemeral"}
            out.append(block)
        elif part[0] == "image":
            out.append(messages_image_block(part[1]))
        else:
            out.append(ctx.pick(DOCUMENTS))
    if ctx.fault("block", 60):
        out.append(ctx.pick(BAD_BLOCKS))
    if ctx.fault("content", 40):
        return []
    return out


def _dict_safe(value: Any) -> bool:
    """Whether a value survives the Python-object body path (finite floats, ints within the
    JSON number range); other values raise OverflowError / ValueError at construction."""
    if isinstance(value, dict):
        return all(_dict_safe(v) for v in value.values())
    if isinstance(value, list):
        return all(_dict_safe(v) for v in value)
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**64
    return True


def messages_input_value(ctx: Ctx, args: str) -> Any:
    try:
        value = json.loads(args)
    except ValueError:
        return ctx.pick([{}, "notobj", [1, 2]])
    if not _dict_safe(value) and not ctx.fault("block", 80):
        return {}
    return value if isinstance(value, dict) or ctx.chance(50) else {}


def messages_turns(ctx: Ctx, script: list[dict], deferred: list[str]) -> tuple[Any, list]:
    system = None
    messages: list[dict] = []
    for index, turn in enumerate(script):
        kind = turn["kind"]
        if kind == "system" and index == 0:
            texts_ = [p[1] for p in turn["parts"] if p[0] == "text"] or [""]
            if ctx.chance(50):
                system = [{"type": "text", "text": t} for t in texts_]
            else:
                system = "\n\n".join(texts_)
        elif kind in ("system", "reminder"):
            if kind == "reminder":
                text = turn["text"]
            else:
                text = "".join(p[1] for p in turn["parts"] if p[0] == "text")
            blocks: list[dict] = [{"type": "text", "text": text or "sys"}]
            if deferred and ctx.chance(60):
                name = ctx.pick(deferred)
                if ctx.fault("tool_addition", 50):
                    name = "zz"
                blocks.append(
                    {"type": "tool_addition", "tool": {"type": "tool_reference", "name": name}}
                )
            messages.append({"role": "system", "content": blocks})
        elif kind == "user":
            content = messages_blocks(ctx, turn["parts"])
            if ctx.fault("tool_addition", 30) and deferred:
                content = [
                    {
                        "type": "tool_addition",
                        "tool": {"type": "tool_reference", "name": deferred[0]},
                    }
                ]
            previous = messages[-1] if messages else None
            if (
                previous is not None
                and previous["role"] == "user"
                and isinstance(previous["content"], list)
                and any(b.get("type") == "tool_result" for b in previous["content"])
                and isinstance(content, list)
                and ctx.chance(50)
            ):
                previous["content"].extend(content)  # text right after the tool results
            else:
                messages.append({"role": "user", "content": content})
        elif kind == "assistant":
            blocks = []
            if turn["reasoning"] is not None:
                blocks.append({"type": "thinking", "thinking": turn["reasoning"], "signature": "s"})
            if turn["content"] or not turn["calls"]:
                blocks.append({"type": "text", "text": turn["content"]})
            for call in turn["calls"]:
                value = messages_input_value(ctx, call["args"])
                blocks.append(
                    {"type": "tool_use", "id": call["id"], "name": call["name"], "input": value}
                )
            if len(blocks) == 1 and blocks[0]["type"] == "text" and ctx.chance(50):
                messages.append({"role": "assistant", "content": blocks[0]["text"]})
            else:
                messages.append({"role": "assistant", "content": blocks})
        elif kind == "results":
            blocks = []
            for result in turn["results"]:
                block: dict[str, Any] = {"type": "tool_result", "tool_use_id": result["id"]}
                if ctx.chance(80):
                    block["content"] = messages_blocks(ctx, result["parts"])
                if ctx.chance(20):
                    block["is_error"] = ctx.pick([True, False])
                blocks.append(block)
            messages.append({"role": "user", "content": blocks})
    return system, messages


def messages_tool(tool: dict) -> dict:
    out: dict[str, Any] = {"name": tool["name"]}
    if "description" in tool:
        out["description"] = tool["description"]
    if "parameters" in tool and tool["parameters"] is not None:
        out["input_schema"] = tool["parameters"]
    elif "schema" not in tool.get("faults", ()):
        out["input_schema"] = {"type": "object", "properties": {}}
    if tool["defer_loading"]:
        out["defer_loading"] = True
    if tool["strict"] is not None:
        out["strict"] = tool["strict"]
    return out


SERVER_TOOLS_MESSAGES = [
    {"type": "web_search_20250305", "name": "web_search"},
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250124", "name": "str_replace_editor"},
    {"type": "custom", "name": "c", "input_schema": {"type": "object"}},
]


def messages_body(ctx: Ctx) -> dict:
    tools = tool_specs(ctx) if ctx.chance(60) else []
    if tools and all(t["defer_loading"] for t in tools) and not ctx.fault("deferred", 80):
        tools[0]["defer_loading"] = False
    if ctx.fault("schema", 30) and tools:
        tools[0].pop("parameters", None)
        tools[0]["faults"] = ("schema",)
    declared = [messages_tool(t) for t in tools]
    names = [t["name"] for t in tools]
    deferred = [t["name"] for t in tools if t["defer_loading"]]
    web_search_dropped = ["messages_web_search", "Drop"] in ctx.options.get("with", []) or (
        ctx.options.get("ctor", {}).get("messages_web_search") == "Drop"
    )
    if (web_search_dropped and ctx.chance(20)) or ctx.fault("server_tool", 60):
        declared.append(ctx.pick(SERVER_TOOLS_MESSAGES))
    script = conversation_script(ctx, names)
    system, messages = messages_turns(ctx, script, deferred)
    if deferred and messages and ctx.chance(70):
        # a system message that brings a deferred tool in (rendered in place by V4.1)
        blocks = [
            {"type": "text", "text": ctx.draw(texts(2))},
            {"type": "tool_addition", "tool": {"type": "tool_reference", "name": deferred[-1]}},
        ]
        position = ctx.draw(st.integers(1, len(messages)))
        messages.insert(position, {"role": "system", "content": blocks})
    if ctx.fault("content", 40):
        messages = []
    body: dict[str, Any] = {"model": model_name(ctx), "messages": messages}
    if system is not None:
        body["system"] = system
    if ctx.chance(80):
        body["max_tokens"] = max_token_value(ctx)
    if declared:
        body["tools"] = declared
    switch = effort = None
    if ctx.chance(50):
        switch = ctx.pick_faulty("enum", ["enabled", "disabled", "adaptive", "disabled"], ["auto"])
        body["thinking"] = {"type": switch}
        if switch == "enabled" and ctx.chance(50):
            body["thinking"]["budget_tokens"] = 1024
    if ctx.chance(30):
        effort = ctx.pick_faulty(
            "enum", ["high", "none", "low", "medium", "xhigh", "max", "ultra"], ["bogus", "minimal"]
        )
        body["output_config"] = {"effort": effort}
    choice = tool_choice_mode(ctx, thinking_is_off(ctx, switch, effort), names)
    if choice is not None:
        if choice[0] == "named":
            body["tool_choice"] = {"type": "tool", "name": choice[1]}
        else:
            mapped = {"auto": "auto", "none": "none", "required": "any"}[choice[0]]
            body["tool_choice"] = {"type": mapped}
            if ctx.chance(20):
                body["tool_choice"]["disable_parallel_tool_use"] = True
    sampling_options(ctx, body)
    if ctx.chance(10):
        body["top_k"] = 5
    if ctx.chance(20) or "stop" in ctx.faults:
        body["stop_sequences"] = stop_value(ctx, allow_string=False)
    stream = ctx.chance(30)
    if stream or ctx.chance(10):
        body["stream"] = stream
    if ctx.chance(10):
        body.update(
            {
                "metadata": {"user_id": "u"},
                "service_tier": "auto",
                "container": "c",
                "mcp_servers": [],
                "output_format": {"type": "json_schema", "schema": {"type": "object"}},
            }
        )
    return body
