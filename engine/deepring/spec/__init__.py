"""The engine-independent pieces of speculative decoding (DSpark): lossless verification of
drafts and its deterministic randomness (accept), the confidence-driven prefix scheduler
(schedule), the steps-per-second curve it trades against (profile), and the calibration of the
drafter's confidence head (calibrate). Torch, numpy, sampling's SplitMix64 and cost's StepCost;
no engine state, so the engine and offline tools share it."""

from deepring.spec.accept import accept_greedy, accept_sampled, step_uniforms, uniforms
from deepring.spec.calibrate import (
    apply_temperatures,
    cumulative,
    expected_calibration_error,
    fit_temperatures,
)
from deepring.spec.profile import LinearTimes, StepsPerSecond, profile
from deepring.spec.schedule import schedule, throughput

__all__ = [
    "LinearTimes",
    "StepsPerSecond",
    "accept_greedy",
    "accept_sampled",
    "apply_temperatures",
    "cumulative",
    "expected_calibration_error",
    "fit_temperatures",
    "profile",
    "schedule",
    "step_uniforms",
    "throughput",
    "uniforms",
]
