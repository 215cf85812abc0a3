"""Speculative decoding on the trained tiny model (CPU): tokens/s per user and in aggregate at
each batch size for off / 1-token drafts / fixed:5 / dspark, the mean accepted length, and the
calibration error of the DSpark confidence head.

`tiny-trained` carries a DSpark drafter in its MTP slots and no MTP layer, so `--speculative
mtp` cannot run on it; the MTP-1 baseline is stood in for by `fixed:1` (the DSpark drafter, one
token per step: the same verify shape as MTP-1, with a better drafter than a one-layer MTP).
Every mode gets the same prompts (windows of the Python standard library's source, what the
model was trained on) and greedy sampling, and must produce the same tokens as `off` (checked).
The modes run interleaved, repetition by repetition, so the machine's load drifts over all of
them alike.

Per user: each request's tokens over the wall time from the batch's start to its own last
token, averaged over requests. Aggregate: all tokens over the batch's wall time. Mean accepted
length: tokens emitted per request-step that verified drafts (1 + accepted drafts). Calibration
(from fixed:5, which verifies every draft): the expected calibration error (10 bins) of the
drafter's survival a_k against "drafts 1..k were all accepted", over every verified position.

Each batch size runs as many batches of different prompts as make `--min-prompts` (medians
over all of them and the repetitions): one prompt's acceptance decides a batch of one's speed
(batch 1 over 3 prompts measured dspark at 1.34x off, over 8 at 1.77x, in the same hour).

Usage: python bench/speculative.py [--batch-sizes 1,8,32] [--new-tokens 64] [--reps 2]
                                   [--min-prompts 8] [--modes off,fixed:1,fixed:5,dspark]
                                   [--threads N]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import torch
from _machine import describe


def prompts(llm, count: int, length: int) -> list[list[int]]:
    """`count` windows of `length` tokens from standard-library modules' source."""
    import argparse as a
    import collections
    import json
    import os
    import pathlib
    import textwrap

    mods = [a, collections, json, os, pathlib, textwrap, inspect, statistics]
    ids: list[int] = []
    for m in mods:
        ids += llm.encode(inspect.getsource(m))[1:]
    step = max(1, (len(ids) - length) // max(count, 1))
    return [ids[i * step : i * step + length] for i in range(count)]


def run(llm, batch: list[list[int]], new_tokens: int):
    """(per-user tokens/s, aggregate tokens/s, outputs) of one batch."""
    from deepring import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    engine = llm.engine
    done: dict[int, float] = {}
    reqs = [engine.add(10_000_000 + i + run.n, p, params, seed=0) for i, p in enumerate(batch)]
    run.n += len(batch)
    t0 = time.perf_counter()
    while engine.has_work:
        for r in engine.step():
            if r.finished:
                done[r.request.rid] = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    per_user = statistics.mean(len(r.output_ids) / done[r.rid] for r in reqs)
    total = sum(len(r.output_ids) for r in reqs)
    return per_user, total / wall, [list(r.output_ids) for r in reqs]


run.n = 0


def calibration(record: list[tuple[list[float], int]]) -> float:
    from deepring.spec.calibrate import expected_calibration_error

    probs, hits = [], []
    for survival, n in record:
        for k, a in enumerate(survival):
            probs.append(a)
            hits.append(1.0 if k < n else 0.0)
    if not probs:
        return float("nan")
    return expected_calibration_error(torch.tensor(probs), torch.tensor(hits))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--min-prompts", type=int, default=8, help="distinct prompts per size")
    ap.add_argument("--modes", default="off,fixed:1,fixed:5,dspark")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from deepring import LLM

    print(describe())
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    modes = args.modes.split(",")
    llms = {
        m: LLM("tiny-trained", max_model_len=512, max_num_seqs=max(sizes), speculative=m)
        for m in modes
    }
    for llm in llms.values():
        if llm.engine.spec is not None:
            llm.engine.spec.record = []
    print(f"tiny-trained, greedy, {args.prompt_tokens} prompt + {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), {args.reps} interleaved repetitions, "
          f">= {args.min_prompts} prompts per batch size")  # fmt: skip
    warm = prompts(llms[modes[0]], 2, args.prompt_tokens)
    for llm in llms.values():
        run(llm, warm, 8)
    for b in sizes:
        # Several batches of different prompts per size: a single prompt's acceptance (and so
        # a batch of one's speed) varies with its text far more than the machine drifts.
        count = -(-args.min_prompts // b)
        pool = prompts(llms[modes[0]], b * count, args.prompt_tokens)
        batches = [pool[i * b : (i + 1) * b] for i in range(count)]
        stats = {m: ([], []) for m in modes}
        spec0 = {m: _counts(llms[m]) for m in modes}
        refs: list = [None] * len(batches)
        for _ in range(args.reps):
            for i, batch in enumerate(batches):
                for m in modes:
                    pu, agg, outs = run(llms[m], batch, args.new_tokens)
                    if refs[i] is None:
                        refs[i] = outs
                    elif outs != refs[i]:
                        raise SystemExit(f"{m} at batch {b}: output differs from {modes[0]}'s")
                    stats[m][0].append(pu)
                    stats[m][1].append(agg)
        base = statistics.median(stats[modes[0]][0])
        print(f"\nbatch {b}:")
        print(f"  {'mode':10} {'per user tok/s':>15} {'x ' + modes[0]:>8} {'aggregate':>10} "
              f"{'accepted len':>13} {'drafts/step':>12}")  # fmt: skip
        for m in modes:
            pu = statistics.median(stats[m][0])
            agg = statistics.median(stats[m][1])
            tau, per_step = _tau(spec0[m], _counts(llms[m]))
            print(f"  {m:10} {pu:15.1f} {pu / base:8.2f} {agg:10.1f} {tau:>13} {per_step:>12}")
    for m in modes:
        spec = llms[m].engine.spec
        if spec is not None and spec.record:
            ece = calibration(spec.record)
            print(f"\n{m}: confidence calibration error (ECE, 10 bins, every verified draft): "
                  f"{ece:.3f} over {len(spec.record)} request-steps")  # fmt: skip


def _counts(llm) -> tuple[int, int, int]:
    s = llm.engine.spec
    return (0, 0, 0) if s is None else (s.spec_steps, s.accepted, s.verified)


def _tau(before, after) -> tuple[str, str]:
    steps, acc, ver = (a - b for a, b in zip(after, before, strict=True))
    if steps == 0:
        return "-", "-"
    return f"{(steps + acc) / steps:.2f}", f"{ver / steps:.2f}"


if __name__ == "__main__":
    main()
