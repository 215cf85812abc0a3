"""Overlapped worker loop benchmark (issue 20): `deepring serve --zero-cost` with a paced engine
step (`--zero-cost-step-ms`, default 5: the stand-in for the device's time, during which the
step thread holds no CPU), with the overlapped loop (the default) against `--no-overlap`, in
interleaved A/B pairs (the machine drifts ~10% between minutes).

Per run, from the decode worker's step timeline (`--trace-dir`) and /metrics:
- CPU per step: the loop's and the step's work besides the paced compute (poll, messages,
  send, schedule, post, the role's bookkeeping), in ms;
- hidden: the share of that CPU time spent while a step's compute ran (overlapped), the
  issue's target (>= 80% with the zero-cost runner);
- tokens/s and TPOT p50 of 64 streaming clients (deepring.loadgen).

Usage: python bench/overlap.py [--pairs 3] [--step-ms 5] [--clients 64] [--max-tokens 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _machine import describe
from deepring import loadgen
from serve import OUT, Server

TARGET_HIDDEN = 0.80


def _spans(path: Path) -> list[dict]:
    text = path.read_text()
    if not text.rstrip().endswith("]"):
        text = text.rstrip().rstrip(",") + "]"
    return [e for e in json.loads(text) if e.get("ph") == "X"]


def _overlap(a: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    """Microseconds of interval `a` covered by the (disjoint, sorted) `spans`."""
    s, e = a
    return sum(max(0.0, min(e, y) - max(s, x)) for x, y in spans if x < e and y > s)


def analyse(trace: Path) -> dict:
    spans = _spans(trace)
    compute = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == "compute")
    steps = len(compute)
    # CPU work: everything but compute and the spans that contain others (step: the role's
    # whole step, which holds schedule / compute / post) or wait (poll with a timeout is
    # counted, it is bounded by 0 when busy; idle polls are outside any compute anyway).
    work = [e for e in spans if e["name"] in ("poll", "messages", "send", "schedule", "post")]
    role = [e for e in spans if e["name"] == "step"]
    inner = {n: sum(e["dur"] for e in spans if e["name"] == n) for n in ("schedule", "post")}
    role_extra = sum(e["dur"] for e in role) - sum(inner.values()) - sum(y - x for x, y in compute)
    busy_polls = [
        e for e in work
        if e["name"] == "poll" and _overlap((e["ts"], e["ts"] + e["dur"]), compute) > 0
    ]  # fmt: skip
    loop_work = [e for e in work if e["name"] in ("messages", "send")] + busy_polls
    cpu = sum(e["dur"] for e in loop_work) + sum(inner.values()) + max(0.0, role_extra)
    hidden = sum(_overlap((e["ts"], e["ts"] + e["dur"]), compute) for e in loop_work)
    return {
        "steps": steps,
        "cpu_ms_per_step": cpu / max(1, steps) / 1e3,
        "hidden": hidden / cpu if cpu else 0.0,
    }


def run(mode: str, args) -> dict:
    traces = Path(tempfile.mkdtemp(prefix=f"overlap-{mode}-"))
    extra = ["--zero-cost", "--zero-cost-step-ms", str(args.step_ms), "--max-num-seqs",
             str(args.clients), "--trace-dir", str(traces)]  # fmt: skip
    if mode == "sequential":
        extra.append("--no-overlap")
    server = Server(extra, OUT / f"overlap-{mode}.log")
    try:
        loadgen.run(server.url, "tiny", 2, 1, 16, 8, seed=999)  # warm-up
        load = loadgen.run(
            server.url, "tiny", args.clients, args.requests, 16, args.max_tokens, args.seed
        )
    finally:
        server.stop()
    out = analyse(traces / "decode-0.trace.json")
    out.update(mode=mode, tokens_per_s=load["tokens_per_s"], tpot_p50_ms=load["tpot_p50"] * 1e3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    print(describe())
    OUT.mkdir(exist_ok=True)
    rows: dict[str, list[dict]] = {"sequential": [], "overlapped": []}
    for i in range(args.pairs):
        for mode in ("sequential", "overlapped") if i % 2 == 0 else ("overlapped", "sequential"):
            r = run(mode, args)
            rows[mode].append(r)
            print(f"  pair {i + 1} {mode:>10}: {r['tokens_per_s']:.0f} tok/s, TPOT p50 "
                  f"{r['tpot_p50_ms']:.2f} ms, CPU {r['cpu_ms_per_step']:.3f} ms/step, "
                  f"hidden {r['hidden']:.0%}", flush=True)  # fmt: skip
    med = {m: {k: statistics.median(r[k] for r in rs) for k in
               ("tokens_per_s", "tpot_p50_ms", "cpu_ms_per_step", "hidden")}
           for m, rs in rows.items()}  # fmt: skip
    s, o = med["sequential"], med["overlapped"]
    print(f"medians: overlapped / sequential tokens/s {o['tokens_per_s'] / s['tokens_per_s']:.2f}, "
          f"TPOT p50 {o['tpot_p50_ms']:.2f} vs {s['tpot_p50_ms']:.2f} ms; CPU per step "
          f"{o['cpu_ms_per_step']:.3f} vs {s['cpu_ms_per_step']:.3f} ms; hidden "
          f"{o['hidden']:.0%} (target {TARGET_HIDDEN:.0%}) vs {s['hidden']:.0%}")  # fmt: skip
    (OUT / "overlap.json").write_text(json.dumps({"runs": rows, "medians": med}, indent=1))


if __name__ == "__main__":
    main()
