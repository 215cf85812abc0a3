"""Responses bodies."""

from __future__ import annotations

from typing import Any

from .context import Ctx
from .fields import (
    max_token_value,
    model_name,
    response_format_spec,
    sampling_options,
    thinking_is_off,
    tool_choice_mode,
)
from .images import image_url_of
from .schemas import tool_specs
from .script import conversation_script
from .values import short_texts, texts


def responses_part(ctx: Ctx, part: tuple, text_type: str) -> dict:
    if part[0] == "text":
        return {"type": text_type, "text": part[1]}
    if part[0] == "image":
        spec = part[1]
        out: dict[str, Any] = {"type": "input_image"}
        if spec["kind"] == "file_id":
            out["file_id"] = "file-1"
        else:
            out["image_url"] = image_url_of(spec)
        if "detail" in spec:
            out["detail"] = spec["detail"]
        return out
    if ctx.fault("image", 50):
        return {"type": "input_image"}
    return ctx.pick(
        [
            {"type": "input_file", "file_id": "file-1"},
            {"type": "input_file", "file_data": "aGk=", "filename": "a.txt"},
        ]
    )


def responses_content(ctx: Ctx, parts: list[tuple], role: str) -> Any:
    if len(parts) == 1 and parts[0][0] == "text" and not ctx.chance(40):
        return parts[0][1]
    text_type = "output_text" if role == "assistant" and ctx.chance(80) else "input_text"
    return [responses_part(ctx, p, text_type) for p in parts]


def responses_items(ctx: Ctx, script: list[dict], custom_names: set[str]) -> list[dict]:
    items: list[dict] = []
    for turn in script:
        kind = turn["kind"]
        if kind in ("system", "user", "reminder"):
            if kind == "reminder":
                role, parts = "developer", [("text", turn["text"])]
            elif kind == "system":
                role, parts = ctx.pick(["system", "developer"]), turn["parts"]
            else:
                role, parts = "user", turn["parts"]
            item = {"role": role, "content": responses_content(ctx, parts, role)}
            if ctx.chance(30):
                item["type"] = "message"
            items.append(item)
            if kind == "user" and ctx.chance(4):
                items.append(
                    ctx.pick(
                        [
                            {"type": "item_reference", "id": "msg_1"},
                            {"type": "apply_patch_call", "call_id": "p", "operation": {}},
                        ]
                    )
                )
        elif kind == "assistant":
            if turn["reasoning"] is not None:
                reasoning: dict[str, Any] = {"type": "reasoning", "summary": []}
                if ctx.chance(30):
                    reasoning["summary"] = [{"type": "summary_text", "text": "ignored"}]
                if ctx.chance(30):
                    reasoning["id"] = "rs_1"
                if turn["reasoning"] or ctx.chance(50):
                    reasoning["content"] = [{"type": "reasoning_text", "text": turn["reasoning"]}]
                if ctx.chance(10):
                    reasoning["encrypted_content"] = "opaque"
                items.append(reasoning)
            if turn["content"] or not turn["calls"]:
                content = responses_content(ctx, [("text", turn["content"])], "assistant")
                items.append({"role": "assistant", "content": content})
            for call in turn["calls"]:
                if call["name"] in custom_names:
                    items.append(
                        {
                            "type": "custom_tool_call",
                            "call_id": call["id"],
                            "name": call["name"],
                            "input": ctx.draw(texts(3)),
                        }
                    )
                    continue
                item = {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": call["args"],
                }
                if "::" in call["name"]:
                    namespace, local = call["name"].split("::", 1)
                    item["name"], item["namespace"] = local, namespace
                items.append(item)
        elif kind == "results":
            for result in turn["results"]:
                output = responses_content(ctx, result["parts"], "user")
                kind_ = (
                    "custom_tool_call_output"
                    if result["name"] in custom_names
                    else "function_call_output"
                )
                items.append({"type": kind_, "call_id": result["id"], "output": output})
    return items


def responses_tool(tool: dict) -> dict:
    out: dict[str, Any] = {"type": "function", "name": tool["name"]}
    for key in ("description", "parameters"):
        if key in tool:
            out[key] = tool[key]
    if tool["strict"] is not None:
        out["strict"] = tool["strict"]
    if tool["defer_loading"]:
        out["defer_loading"] = True
    return out


SERVER_TOOLS_RESPONSES = [
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["v"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "apply_patch"},
]


def responses_body(ctx: Ctx) -> dict:
    tools = tool_specs(ctx) if ctx.chance(60) else []
    declared: list[dict] = [responses_tool(t) for t in tools]
    call_names = [t["name"] for t in tools]
    custom_names: set[str] = set()
    any_strict = any(t["strict"] for t in tools)
    if ctx.chance(20) and (not any_strict or "strict_mix" in ctx.faults):
        declared.append({"type": "custom", "name": "apply_patch", "description": "ignored"})
        call_names.append("apply_patch")
        custom_names.add("apply_patch")
    if ctx.fault("custom_tool", 80):
        declared.append({"type": "custom", "name": ctx.pick(["x", "apply-patch"])})
    if ctx.chance(20):
        strictness = tools[0]["strict"] if tools else "draw"
        inner = [responses_tool(t) for t in tool_specs(ctx, max_tools=2, strictness=strictness)]
        namespace = ctx.pick(["crm", "ns", "a-b"])
        description = ctx.draw(short_texts)
        declared.append(
            {"type": "namespace", "name": namespace, "description": description, "tools": inner}
        )
        call_names += [f"{namespace}::{t['name']}" for t in inner]
    if ctx.chance(15) or ctx.fault("server_tool", 60):
        declared.append(ctx.pick([*SERVER_TOOLS_RESPONSES, {"type": "computer_use_preview"}]))
    script = conversation_script(ctx, call_names)
    body: dict[str, Any] = {"model": model_name(ctx)}
    shape = ctx.pick(["items", "items", "string", "instructions_only"])
    if ctx.fault("input", 80):
        shape = ctx.pick(["empty", "missing"])
    if shape == "items":
        body["input"] = responses_items(ctx, script, custom_names)
    elif shape == "string":
        body["input"] = ctx.draw(short_texts)
    elif shape == "empty":
        body["input"] = []
    if shape == "instructions_only" or ctx.chance(30):
        body["instructions"] = ctx.draw(texts(3, min_size=1).filter(bool))
    if declared:
        body["tools"] = declared
    effort = None
    if ctx.chance(50):
        reasoning: dict[str, Any] = {}
        if ctx.chance(80):
            effort = ctx.pick_faulty(
                "enum",
                ["high", "none", "none", "minimal", "low", "medium", "xhigh", "max", None],
                ["ultra", "bogus"],
            )
            reasoning["effort"] = effort
        if ctx.chance(20):
            reasoning["summary"] = ctx.pick(["auto", "concise", "detailed", None])
        body["reasoning"] = reasoning
    choice = tool_choice_mode(ctx, thinking_is_off(ctx, None, effort), call_names)
    if choice is not None:
        body["tool_choice"] = (
            {"type": "function", "name": choice[1]} if choice[0] == "named" else choice[0]
        )
    if ctx.fault("tool_choice_shape", 80):
        body["tool_choice"] = ctx.pick(
            [
                {"type": "allowed_tools", "mode": "auto", "tools": []},
                {"type": "custom", "name": "apply_patch"},
                {"type": "web_search"},
                "bogus",
                {"type": "function"},
            ]
        )
    sampling_options(ctx, body)
    if ctx.chance(25):
        body["max_output_tokens"] = max_token_value(ctx)
    if ctx.chance(10):
        body["top_logprobs"] = ctx.pick_faulty("enum", [0, 3, 20], [21, -1])
    if ctx.chance(35):
        text: dict[str, Any] = {}
        spec = response_format_spec(ctx, declared) if ctx.chance(85) else None
        if spec is not None:
            text["format"] = (
                {k: v for k, v in spec.items() if k != "regex"}
                if spec["type"] != "regex"
                else {"type": "text"}
            )
            if spec["type"] == "json_object" and ctx.json_hint:
                body["instructions"] = "Answer in json."
        if ctx.chance(20):
            text["verbosity"] = ctx.pick(["low", "medium", "high"])
        body["text"] = text
    stream = ctx.chance(30)
    if stream or ctx.chance(10):
        body["stream"] = stream
    if ctx.chance(10):
        body["user"] = ctx.pick(["u-1", "日本"])
    if ctx.chance(10):
        body.update(
            {
                "previous_response_id": "resp_0",
                "store": False,
                "background": False,
                "include": ["reasoning.encrypted_content"],
                "metadata": {"k": "v"},
                "parallel_tool_calls": True,
                "truncation": "disabled",
                "thinking": {"type": "disabled"},
            }
        )
    return body
