"""Measure the embedded tiny model's step times on this machine and fit the step-time model
(`deepring simulate --calibrate`; cost.presets.TINY_CPU came from it).

The workloads cover the model's features: prefill chunks of several sizes at several depths,
decode batches of several sizes and contexts, and mixed steps (a batch decoding while a prompt
is fed in chunks). Every engine step is a sample (EngineCore times each one and keeps its
shape); the fit is a least-squares fit over all of them.
"""

from __future__ import annotations

import itertools
import os
import time

from deepring.cost.model import StepCost, StepShape, fit
from deepring.cost.presets import TINY_CPU

Sample = tuple[StepShape, float]


def _engine(budget: int):
    from deepring.config import EngineSpec
    from deepring.core.build import build_engine

    spec = EngineSpec(
        max_model_len=4096, max_num_seqs=64, max_num_batched_tokens=budget, prefix_cache=False,
        cpu_threads=1,
    )  # fmt: skip
    return build_engine(spec).engine


def _drain(engine, out: list[Sample], limit_s: float) -> None:
    """Step until idle (at most limit_s), keeping every step's shape and time."""
    end = time.monotonic() + limit_s
    while engine.has_work and time.monotonic() < end:
        if engine.step() and engine.last_step is not None:
            out.append(engine.last_step)
    engine.abort_all()


def workloads(engine, out: list[Sample], scale: float = 1.0) -> None:
    """The calibration steps (scale < 1: fewer, for a quick check). Each kind of step is
    measured on its own, so the features do not move together: prefill chunks (one prompt),
    decode batches (their prompts' first steps are samples too), and mixed steps."""
    from deepring.sampling.params import SamplingParams

    rid = itertools.count(1)
    sched = engine.scheduler
    config = type(sched.config)

    def add(n_prompt: int, max_tokens: int) -> None:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        engine.add(next(rid), [5 + i % 900 for i in range(n_prompt)], params, seed=1)

    for chunk in (16, 64, 256, 512, 1024):  # prefill chunks at depths 0, chunk, 2 chunk, ...
        sched.config = config(max_num_seqs=64, max_num_batched_tokens=chunk)
        add(min(2048, max(chunk, int(4 * chunk * scale))), 1)
        _drain(engine, out, 60)
    shapes = [*itertools.product((1, 8, 32), (32, 512, 1536)), (64, 32), (64, 512)]
    for batch, context in shapes:
        # A decode batch; its prompts go in 512-token steps first.
        sched.config = config(max_num_seqs=64, max_num_batched_tokens=512)
        for _ in range(batch):
            add(context, max(3, int(10 * scale)))
        _drain(engine, out, 60)
    for batch, chunk in ((8, 128), (32, 256), (16, 512)):  # mixed steps
        sched.config = config(max_num_seqs=64, max_num_batched_tokens=4096)
        for _ in range(batch):
            add(256, max(8, int(24 * scale)))
        engine.step()  # their prompts (the first step)
        sched.config = config(max_num_seqs=64, max_num_batched_tokens=batch + chunk)
        add(int(6 * chunk * scale) + 1, 1)
        _drain(engine, out, 60)


def measure(scale: float = 1.0) -> tuple[StepCost, list[Sample]]:
    """The fit of this machine's tiny model, and the samples it came from."""
    os.environ.setdefault("DEEPRING_GREEDY_HEAD", "bf16")  # as the benches run it
    engine = _engine(512)
    warm: list[Sample] = []
    workloads(engine, warm, scale=0.25)  # compile and warm every kernel first
    samples: list[Sample] = []
    workloads(engine, samples, scale)
    return fit(medians(samples), TINY_CPU, robust=True), samples


def medians(samples: list[Sample]) -> list[Sample]:
    """One sample per kind of step: the lower-quartile time of the steps of about the same
    shape. On a machine shared with other jobs single steps vary two- or threefold (another
    job's work only ever adds time), and least squares over all of them splits the time
    between the features differently from run to run."""
    groups: dict[tuple, list[Sample]] = {}
    for shape, seconds in samples:
        key = (shape.tokens, shape.seqs, round(shape.pairs, -4), round(shape.context, -3))
        groups.setdefault(key, []).append((shape, seconds))
    out = []
    for group in groups.values():
        group.sort(key=lambda s: s[1])
        out.append(group[len(group) // 4])
    return out


def main() -> int:
    t0 = time.monotonic()
    model, samples = measure()
    typical = medians(samples)
    worst = max(abs(model.predict(s) - t) / t for s, t in typical)
    names = ("base", "token", "seq", "pair", "context")
    print(f"{len(samples)} steps ({len(typical)} shapes) measured in {time.monotonic() - t0:.0f}s")
    coefs = ", ".join(f"{n}={c:.3g}" for n, c in zip(names, model.coef, strict=True))
    print(f"  fit: StepCost.of({coefs})")
    errors = sorted(abs(model.predict(s) - t) / t for s, t in typical)
    print(
        f"  relative error over the shapes' medians: median {errors[len(errors) // 2]:.1%}, "
        f"worst {worst:.1%}"
    )
    return 0
