"""The engine-independent pieces of speculative decoding (DSpark): lossless verification of
drafts and its deterministic randomness (accept), the confidence-driven prefix scheduler
(schedule) and the steps-per-second curve it trades against (profile). Torch and numpy only;
no engine state."""

from deepring.spec.accept import accept_greedy, accept_sampled, step_uniforms, uniforms
from deepring.spec.profile import StepsPerSecond, profile
from deepring.spec.schedule import schedule, throughput

__all__ = [
    "StepsPerSecond",
    "accept_greedy",
    "accept_sampled",
    "profile",
    "schedule",
    "step_uniforms",
    "throughput",
    "uniforms",
]
