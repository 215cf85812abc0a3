"""The engine-independent pieces of speculative decoding (DSpark): lossless verification of
drafts and its deterministic randomness (accept) and the confidence-driven prefix scheduler
(schedule). Torch and numpy only; no engine state."""

from deepring.spec.accept import accept_greedy, accept_sampled, step_uniforms, uniforms
from deepring.spec.schedule import schedule, throughput

__all__ = [
    "accept_greedy",
    "accept_sampled",
    "schedule",
    "step_uniforms",
    "throughput",
    "uniforms",
]
