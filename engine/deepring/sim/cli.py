"""`deepring simulate`: generate a trace, replay it on a simulated cluster under each router,
print the table (and the cost router's ratios to the token router)."""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace

from deepring.cost.model import StepCost
from deepring.cost.presets import PRESETS
from deepring.sim.cluster import Cluster, ClusterConfig
from deepring.sim.report import summarize, table
from deepring.sim.trace import SHAPES, TraceConfig, generate, stats


def session_work(
    c: TraceConfig, model: StepCost, prefill_budget: int, block_size: int, n: int = 400
) -> tuple[float, float]:
    """Mean prefill seconds and output tokens per session of this trace shape (sampled): what
    sizes the arrival rate to a load."""
    sessions = generate(replace(c, sessions=n, rate=1.0), seed=12345)
    prefill = output = 0.0
    for s in sessions:
        context = s.system_tokens  # cached after the application's first session
        for t in s.turns:
            cached = context // block_size * block_size  # the history's full blocks
            # Steps of a busy but not backlogged worker hold ~1k tokens, whatever the budget:
            # each pays the step's base.
            chunk = min(prefill_budget, 1024)
            prefill += model.prompt_seconds(context + t.new_tokens - cached, cached, chunk)
            output += t.output_tokens
            context += t.new_tokens + t.output_tokens
    return prefill / n, output / n


def decode_rate(model: StepCost, batch: int, context: int) -> float:
    """Tokens per second of one decode worker running `batch` requests of `context` tokens."""
    return batch / model.decode_step(batch, batch * context)


def sized_rate(args: argparse.Namespace, shape: TraceConfig, model: StepCost) -> float:
    prefill_s, output = session_work(shape, model, args.prefill_budget, 128)
    batch = max(1, int(0.8 * args.max_num_seqs))
    context = shape.system_tokens + 2 * shape.prompt_median + shape.output_median
    per_decode = decode_rate(model, batch, context)
    capacity = min(args.prefill / prefill_s, args.decode * per_decode / output)
    return args.load * capacity


def stragglers(args: argparse.Namespace, model: StepCost) -> dict[str, StepCost]:
    """A seeded choice of slower workers in each role."""
    rng = random.Random(args.seed + 7)
    out = {}
    for role, n in (("prefill", args.prefill), ("decode", args.decode)):
        for i in rng.sample(range(n), round(args.stragglers * n)):
            out[f"{role}-{i}"] = model.scaled(args.straggler_factor)
    return out


def run(args: argparse.Namespace) -> int:
    if args.calibrate:
        from deepring.sim.calibrate import main as calibrate

        return calibrate()
    if args.model not in PRESETS:
        raise ValueError(f"--model must be one of {sorted(PRESETS)}")
    model = PRESETS[args.model]
    shape = SHAPES[args.model]
    rate = args.rate or sized_rate(args, shape, model)
    sessions = generate(replace(shape, sessions=args.sessions, rate=rate), seed=args.seed)
    routers = ["tokens", "cost"] if args.router == "both" else [args.router]
    ms = 1e-3
    base = ClusterConfig(
        prefill=args.prefill, decode=args.decode, model=model, truth=stragglers(args, model),
        tbt_target_s=args.tbt_target * ms if args.tbt_target else None,
        ttft_target_s=args.ttft_target * ms if args.ttft_target else None,
        max_num_seqs=args.max_num_seqs, prefill_budget=args.prefill_budget,
        decode_budget=args.decode_budget, max_model_len=shape.max_context, seed=args.seed,
    )  # fmt: skip
    rows = []
    for router in routers:
        t0 = time.perf_counter()
        cluster = Cluster(replace(base, router=router), sessions).run()
        row = summarize(cluster, args.slo_ttft * ms, args.slo_tbt * ms, base.tbt_target_s)
        row.update(router=router, wall_s=time.perf_counter() - t0, events=cluster.events)
        rows.append(row)
    info = {"trace": stats(sessions), "rate": rate, "model": args.model, "prefill": args.prefill,
            "decode": args.decode}  # fmt: skip
    if args.json:
        print(json.dumps({"setup": info, "rows": rows}, indent=1))
        return 0
    t = info["trace"]
    print(
        f"{args.prefill} prefill x {args.decode} decode workers, model {args.model}, "
        f"{t['sessions']} sessions ({t['turns']} turns) at {rate:.1f}/s; first prompt p50 "
        f"{t['first_prompt_p50']} p99 {t['first_prompt_p99']} max {t['first_prompt_max']}, "
        f"output p50 {t['output_p50']} p99 {t['output_p99']}"
    )
    print(table(rows))
    for r in rows:
        print(f"  {r['router']}: {r['wall_s']:.1f}s wall, {r['events']} events")
    if len(rows) == 2:
        a, b = rows
        print(
            f"cost/tokens: TTFT p99 {b['ttft_p99_ms'] / a['ttft_p99_ms']:.2f}, TBT p99 "
            f"{b['tbt_p99_ms'] / a['tbt_p99_ms']:.2f}, SLO {b['slo_attainment']:.3f} vs "
            f"{a['slo_attainment']:.3f}"
        )
    return 0
