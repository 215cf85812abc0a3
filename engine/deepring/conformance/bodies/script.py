"""The abstract conversation script that each protocol renders into its shapes."""

from __future__ import annotations

from hypothesis import strategies as st

from .context import Ctx
from .images import image_spec
from .values import argument_strings, texts


def user_parts(ctx: Ctx, images: bool = True) -> list[tuple]:
    """("text", s) / ("image", spec) / ("file", variant) parts of a user-side message."""
    parts = []
    for _ in range(ctx.draw(st.integers(1, 3))):
        if images and ctx.chance(20):
            parts.append(("image", image_spec(ctx)))
        elif images and ctx.chance(3):
            parts.append(("file", "other"))
        else:
            parts.append(("text", ctx.draw(texts(4))))
    return parts


def conversation_script(ctx: Ctx, tool_names: list[str], prefix: bool = False) -> list[dict]:
    """Turns of a conversation; `prefix`: the last assistant may be a prefix continuation."""
    draw = ctx.draw
    turns: list[dict] = []
    if ctx.chance(40):
        turns.append({"kind": "system", "parts": user_parts(ctx, images=False)})
    rounds = draw(st.integers(1, 3))
    counter = [0]

    def call_id() -> str:
        counter[0] += 1
        return ctx.pick(["call_", "toolu_", "c", "日"]) + str(counter[0])

    def assistant(final: bool) -> dict:
        calls = []
        if not final and tool_names:
            for _ in range(draw(st.integers(1, 3))):
                calls.append({"id": call_id(), "name": ctx.pick(tool_names), "args": None})
        reasoning = ctx.pick(["text", "none", "empty"])
        return {
            "kind": "assistant",
            "content": draw(texts(4)) if final or ctx.chance(50) else "",
            "reasoning": {"text": draw(texts(3)), "none": None, "empty": ""}[reasoning],
            "calls": calls,
            "prefix": False,
        }

    def results(step: dict) -> dict:
        order = list(step["calls"])
        if len(order) > 1 and ctx.chance(20):
            order.reverse()
        return {
            "kind": "results",
            "results": [
                {"id": c["id"], "name": c["name"], "parts": user_parts(ctx)} for c in order
            ],
        }

    for index in range(rounds):
        last = index == rounds - 1
        turns.append({"kind": "user", "parts": user_parts(ctx)})
        if ctx.chance(10):
            turns.append({"kind": "reminder", "text": draw(texts(3))})
        if ctx.chance(7):
            turns.append({"kind": "system", "parts": user_parts(ctx, images=False), "mid": True})
        if not last:
            for _ in range(draw(st.integers(0, 2))):
                step = assistant(final=False)
                if not step["calls"]:
                    break
                turns.append(step)
                turns.append(results(step))
            turns.append(assistant(final=True))
            continue
        ending = ctx.pick(["user", "toolloop", "assistant", "toolloop", "prefix"])
        if ending == "toolloop" and tool_names:
            for _ in range(draw(st.integers(1, 2))):
                step = assistant(final=False)
                turns.append(step)
                turns.append(results(step))
        elif ending in ("assistant", "prefix"):
            step = assistant(final=True)
            step["prefix"] = ending == "prefix" and prefix
            if step["prefix"] and ctx.chance(50):
                step["content"] = ""
            turns.append(step)
    for turn in turns:
        for call in turn.get("calls", []):
            call["args"] = draw(argument_strings())
    if "history" in ctx.faults:
        break_history(ctx, turns)
    return turns


def break_history(ctx: Ctx, turns: list[dict]) -> None:
    """Make the tool history inconsistent (the fault "history")."""
    result_turns = [t for t in turns if t["kind"] == "results"]
    kind = ctx.pick(["drop_result", "orphan", "duplicate", "swap_id", "assistant_prefix"])
    if kind == "drop_result" and result_turns:
        turn = ctx.pick(result_turns)
        turn["results"].pop()
        if not turn["results"]:
            turns.remove(turn)
    elif kind == "orphan" or not result_turns:
        position = ctx.draw(st.integers(0, len(turns)))
        turns.insert(
            position,
            {
                "kind": "results",
                "results": [{"id": "orphan", "name": "f", "parts": [("text", "r")]}],
            },
        )
    elif kind == "duplicate":
        turn = ctx.pick(result_turns)
        turn["results"].append(dict(turn["results"][0]))
    elif kind == "swap_id":
        ctx.pick(result_turns)["results"][0]["id"] = "other"
    else:
        assistants = [t for t in turns if t["kind"] == "assistant"]
        if assistants:
            ctx.pick(assistants)["prefix"] = True
