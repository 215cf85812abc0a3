"""The per-case context: the fault set, what the options accept, draw helpers."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .option_specs import upper_bound
from .values import chance

KNOWN_MODELS = ["DeepSeek-V4.1-Flash", "DeepSeek-V4-Pro"]
OTHER_MODELS = ["gpt-4o", "deepseek-chat", "", "deepseek-v4-pro", "DeepSeek-V4.1-Flash "]


FAULTS = {
    "common": [
        "mutation",
        "model",
        "temperature",
        "top_p",
        "max_tokens",
        "tool_choice",
        "tool_name",
        "schema",
        "strict_mix",
        "image",
        "history",
        "json_word",
        "format_with_tools",
        "enum",
    ],
    "chat": [
        "n",
        "logprobs",
        "seed",
        "stop",
        "penalty",
        "stream_options",
        "role",
        "file",
        "prefix",
    ],
    "responses": ["input", "custom_tool", "tool_choice_shape", "server_tool"],
    "messages": ["content", "server_tool", "tool_addition", "deferred", "block", "stop"],
}


class Ctx:
    """Draw helpers of one case: probabilities, the fault set and what the options accept."""

    def __init__(self, draw, protocol: str, faults: set[str], options: dict) -> None:
        self.draw = draw
        self.protocol = protocol
        self.faults = faults
        self.options = options
        models = list(KNOWN_MODELS)
        default_thinking = True
        for key, value in options.get("ctor", {}).items():
            if key == "default_thinking_mode":
                default_thinking = value
        for step in options.get("with", []):
            if step[0] == "model_versions_by_name":
                models = list(step[1])
            elif step[0] == "model_alias" and step[1] not in models:
                models.append(step[1])
            elif step[0] == "default_thinking_mode":
                default_thinking = step[1]
        self.models = models
        self.default_thinking = default_thinking
        # json_object needs the word "json" in the messages; bodies add it unless faulty
        self.json_hint = True
        self.upper_bound = upper_bound(options)

    def chance(self, percent: int) -> bool:
        return chance(self.draw, percent)

    def fault(self, kind: str, percent: int = 50) -> bool:
        return kind in self.faults and self.chance(percent)

    def pick(self, values: list) -> Any:
        return self.draw(st.sampled_from(values))

    def pick_faulty(self, kind: str, valid: list, invalid: list, percent: int = 60) -> Any:
        if self.fault(kind, percent):
            return self.pick(invalid)
        return self.pick(valid)
