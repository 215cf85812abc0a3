"""Which greedy head (kernels.greedy_head) to run, by measuring them on the weight itself.

CPU flags do not say which head is fast (ad-hoc timing on the 2-core dev machine, not a bench
script): on an AMD EPYC with AVX512-VNNI oneDNN's int8 linear took ~0.75 s per call on the tiny
model's 129k-row head where the bf16 one took ~5 ms, and with oneDNN held to AVX2 (no native
bf16) the bf16 head was ~2.5x faster than fp32 for one row (the head is read-bound there) but
~3.5x slower for 32 rows (compute-bound, bf16 emulated). So
`auto` times each available head at a few row counts when the weight is prepared and, per
batch size, runs the fastest. Every head gives the exact fp32 argmax; the choice moves speed
only, so a measurement skewed by another process costs time, never a different token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Row counts timed: one request decoding, and a full batch. A step's rows take the choice of the
# nearest bucket at or above them (the largest beyond).
ROW_BUCKETS = (1, 32)
# A head this many times slower than the fp32 head is dropped and not run at the larger row
# counts (int8 on some CPUs: ~50x at one row, ~300x at 32, where a call takes seconds).
GIVE_UP = 5.0
REPEATS = 2  # timed calls per head and bucket after an untimed one; the fastest counts


@dataclass(frozen=True)
class HeadChoice:
    """The head per row bucket and what each measured (seconds per call; None: dropped)."""

    by_rows: dict[int, str]
    seconds: dict[str, dict[int, float | None]]

    def kind(self, rows: int) -> str:
        for bucket in sorted(self.by_rows):
            if rows <= bucket:
                return self.by_rows[bucket]
        return self.by_rows[max(self.by_rows)]

    def describe(self) -> str:
        parts = []
        for bucket in sorted(self.by_rows):
            timed = ", ".join(
                f"{k} {'dropped' if s[bucket] is None else f'{s[bucket] * 1e3:.2f} ms'}"
                for k, s in self.seconds.items()
            )
            parts.append(f"{bucket} rows: {self.by_rows[bucket]} ({timed})")
        return "; ".join(parts)


def measure(
    heads: dict[str, Callable[[torch.Tensor], object]],
    width: int,
    clock: Callable[[], float] = time.perf_counter,
    seed: int = 0,
) -> HeadChoice:
    """Time each head (name -> fn(rows [R, width] fp32)) at every row bucket; 'fp32' must be
    one of them (the reference every other first call is compared with)."""
    if "fp32" not in heads:
        raise ValueError("the fp32 head is the reference of the measurement")
    gen = torch.Generator().manual_seed(seed)
    seconds: dict[str, dict[int, float | None]] = {k: {} for k in heads}
    dropped: set[str] = set()
    for rows in ROW_BUCKETS:
        y = torch.randn(rows, width, generator=gen)
        for name in sorted(heads, key=lambda k: k != "fp32"):  # fp32 first: the reference
            if name in dropped:
                seconds[name][rows] = None
                continue
            heads[name](y)  # untimed: compiles kernels and builds oneDNN primitives once
            best = float("inf")
            for _ in range(REPEATS):
                t = clock()
                heads[name](y)
                best = min(best, clock() - t)
                if name != "fp32" and best > GIVE_UP * seconds["fp32"][rows]:
                    break  # (no second call of a head this slow)
            if name != "fp32" and best > GIVE_UP * seconds["fp32"][rows]:
                dropped.add(name)  # never run at the larger row counts
                seconds[name][rows] = None
                continue
            seconds[name][rows] = best
    by_rows = {}
    for rows in ROW_BUCKETS:
        timed = {k: s[rows] for k, s in seconds.items() if s[rows] is not None}
        by_rows[rows] = min(timed, key=lambda k: (timed[k], k != "fp32"))
    return HeadChoice(by_rows, seconds)
