"""Overlapped engine benchmark (issue 20): `deepring serve --zero-cost` with a paced engine
step (`--zero-cost-step-ms`, default 5: the stand-in for the device's time, a sleep on the
runner's compute thread that holds no CPU), with the overlapped engine (the default:
core.overlap) against `--no-overlap`, in interleaved A/B pairs (the machine drifts ~10%
between minutes).

Per run, from the decode worker's step timeline (`--trace-dir`) and the load generator:
- CPU per step: the loop thread's work besides waiting for the compute (polls, messages,
  planning, launching and posting steps, the role's bookkeeping and sends), in ms;
- hidden: the share of that CPU time spent while a step computed, the issue's target
  (>= 80% with the zero-cost runner);
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


IDLE_POLL_S = 1e-3  # a poll at least this long waited for messages (idle), not CPU work


def _events(path: Path) -> list[dict]:
    text = path.read_text()
    if not text.rstrip().endswith("]"):
        text = text.rstrip().rstrip(",") + "]"
    return json.loads(text)


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _minus(spans, holes) -> list[tuple[float, float]]:
    """`spans` without the parts `holes` cover (both sorted and disjoint)."""
    out, j = [], 0
    for s, e in spans:
        while j < len(holes) and holes[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(holes) and holes[k][0] < e:
            if holes[k][0] > cur:
                out.append((cur, holes[k][0]))
            cur = max(cur, holes[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _length(spans) -> float:
    return sum(e - s for s, e in spans)


def analyse(trace: Path) -> dict:
    """The loop thread's CPU work (its messages, zero-timeout polls and steps, less the waits
    and the compute inside them) and the part of it that ran while a step computed on the
    compute thread (the overlapped engine; with --no-overlap the compute is on the loop
    thread and nothing overlaps it)."""
    events = _events(trace)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]

    def of(pred) -> list[tuple[float, float]]:
        return _merge([(e["ts"], e["ts"] + e["dur"]) for e in spans if pred(e)])

    loop = [t for t, n in names.items() if n == "loop"]
    on_loop = lambda e: e["tid"] in loop  # noqa: E731
    compute = [e for e in spans if e["name"] == "compute"]
    work = of(lambda e: on_loop(e) and (e["name"] in ("messages", "step") or (
        e["name"] == "poll" and e["dur"] < IDLE_POLL_S * 1e6)))  # fmt: skip
    idle = of(lambda e: on_loop(e) and e["name"] in ("wait", "compute"))
    cpu = _minus(work, idle)
    elsewhere = of(lambda e: e["name"] == "compute" and not on_loop(e))
    hidden = _length(cpu) - _length(_minus(cpu, elsewhere))
    total = _length(cpu)
    return {
        "steps": len(compute),
        "cpu_ms_per_step": total / max(1, len(compute)) / 1e3,
        "hidden": hidden / total if total else 0.0,
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
