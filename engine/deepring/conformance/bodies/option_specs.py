"""ConversionOptions specs (the plain-data form tests/conformance/summary `build_options` reads)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .values import chance

SPECIAL_OVERRIDES = {
    "thinking_start": "<THINK>",
    "thinking_end": "</THINK>",
    "dsml": "|DS|",
    "user": "<|U|>",
    "assistant": "<|A|>",
    "system": "<|S|>",
    "eos": "<|EOS|>",
    "bos": "<|BOS|>",
    "image": "<IMG>",
    "latest_reminder": "<|R|>",
}
# at least 4096, so that a generated max_completion_tokens (deviation 1) is always in range
BOUNDS = [393216, 4096, 8192, 65536, 500000]


@st.composite
def conversion_options(draw) -> dict:
    """A ConversionOptions spec: the defaults half of the time, else a mix of constructor
    keywords and `with_*` builder steps."""
    if not chance(draw, 50):
        return {}
    ctor: dict[str, Any] = {}
    steps: list[list] = []

    def setting(name: str, value: Any) -> None:
        if draw(st.booleans()):
            ctor[name] = value
        else:
            steps.append([name, value])

    if chance(draw, 40):
        setting("default_thinking_mode", draw(st.booleans()))
    if chance(draw, 30):
        setting("reasoning_content_behavior", draw(st.sampled_from(["FillEmpty", "Reject"])))
    if chance(draw, 20):
        setting("responses_web_search", draw(st.sampled_from(["Drop", "Reject"])))
    if chance(draw, 30):
        setting("messages_web_search", draw(st.sampled_from(["Reject", "Drop"])))
    if chance(draw, 20):
        setting("thinking_max_tokens_upper_bound", draw(st.sampled_from(BOUNDS)))
    if chance(draw, 20):
        setting("non_thinking_max_tokens_upper_bound", draw(st.sampled_from(BOUNDS)))
    if chance(draw, 10):
        steps.insert(0, ["model_versions_by_name", {"only-model": "DeepseekV41Flash"}])
    if chance(draw, 30):
        names = draw(st.lists(st.sampled_from(["my-alias", "DeepSeek-V4-Pro"]), max_size=2))
        for name in names:
            version = draw(st.sampled_from(["DeepseekV4Pro", "DeepseekV41Flash"]))
            steps.append(["model_alias", name, version])
    if chance(draw, 10):
        keys = draw(st.lists(st.sampled_from(sorted(SPECIAL_OVERRIDES)), min_size=1, unique=True))
        steps.append(["special_tokens", {k: SPECIAL_OVERRIDES[k] for k in keys}])
    return {"ctor": ctor, "with": steps}


def upper_bound(options: dict) -> int:
    bounds = [393216, 393216]
    for key, value in options.get("ctor", {}).items():
        if key == "thinking_max_tokens_upper_bound":
            bounds[0] = value
        elif key == "non_thinking_max_tokens_upper_bound":
            bounds[1] = value
    for step in options.get("with", []):
        if step[0] == "thinking_max_tokens_upper_bound":
            bounds[0] = step[1]
        elif step[0] == "non_thinking_max_tokens_upper_bound":
            bounds[1] = step[1]
    return min(bounds)
