"""Serving benchmark: `deepring serve` under 1, 8, 32 and 64 concurrent streaming clients.

For each mode a fresh server is started: `zero-cost` (tokens without compute: the serving
stack alone, free to batch many tokens per SSE event when it falls behind), `zero-cost-paced`
(the same with a 1 ms engine step, so about one token per event: the per-event cost), `tiny`
(the embedded model on CPU). N clients, each on a keep-alive connection,
send streaming Chat Completions requests back to back (random prompts, greedy, thinking off,
max_tokens output tokens each). Reported per level: output tokens/s over the wall time, TTFT
and TPOT p50/p99, and per-user speed (1 / median TPOT).

Targets: zero-cost >= 10,000 streamed tokens/s at 64 streams (2-core machine); tiny: serving
throughput / `LLM.generate` throughput at the same concurrency (same prompts and lengths,
max_num_seqs = concurrency, 1 torch thread like each serving worker) >= 0.9.

Prints a table and writes bench/out/serve.png (throughput against per-user speed) and
bench/out/serve.json.
Usage: python bench/serve.py [--modes zero-cost,zero-cost-paced,tiny] [--concurrency 1,8,32,64]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _machine import describe
from deepring import loadgen

OUT = Path(__file__).parent / "out"
ZERO_COST_TARGET = 10_000
RATIO_TARGET = 0.9


class Server:
    def __init__(self, args: list[str], log: Path) -> None:
        exe = Path(sys.executable).with_name("deepring")
        cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "deepring.cli"]
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [*cmd, "serve", "--port", "0", *args], stdout=self._out, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            m = re.search(r"deepring: ready on (http://\S+)", log.read_text(errors="replace"))
            if m:
                self.url = m.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"server did not start; see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)
        self._out.close()


MODES = {
    "zero-cost": ["--zero-cost"],
    # Each step takes >= 1 ms: too little time for the frontend to batch several tokens into one
    # event, so this measures the per-event cost of the whole path (one event per token).
    "zero-cost-paced": ["--zero-cost", "--zero-cost-step-ms", "1"],
    "tiny": [],
}


def bench_server(mode: str, args, levels: list[int]) -> list[dict]:
    """One server for the mode; each level is measured `--repeat` times (median kept). For
    `tiny`, LLM.generate runs right after each serving run, so both see the same machine."""
    extra = list(MODES[mode])
    extra += ["--max-num-seqs", str(max(levels)), "--max-model-len", str(args.max_model_len)]
    server = Server(extra, OUT / f"serve-{mode}.log")
    rows = []
    try:
        # Warm-up: first requests pay for lazy initialisation in every process.
        loadgen.run(server.url, "tiny", 2, 1, args.prompt_len, 8, seed=999)
        for c in levels:
            runs, offline = [], []
            for rep in range(args.repeat):
                seed = args.seed + rep
                runs.append(
                    loadgen.run(
                        server.url, "tiny", c, args.requests, args.prompt_len, args.max_tokens, seed
                    )
                )
                if mode == "tiny":
                    offline.append(bench_offline(args, c, seed))
            row = sorted(runs, key=lambda r: r["tokens_per_s"])[len(runs) // 2]
            row["mode"] = mode
            line = f"  {mode}: {c} clients -> {row['tokens_per_s']:.0f} tok/s"
            if offline:
                row["offline_tokens_per_s"] = statistics.median(offline)
                line += f" (LLM.generate {row['offline_tokens_per_s']:.0f} tok/s)"
            rows.append(row)
            print(line, flush=True)
    finally:
        server.stop()
    return rows


def bench_offline(args, concurrency: int, seed: int) -> float:
    """LLM.generate tokens/s over the same requests, max_num_seqs = concurrency."""
    import torch
    from deepring import LLM, SamplingParams
    from deepring.config import EngineSpec

    torch.set_num_threads(args.baseline_threads)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    # The server's step budget (its --max-num-batched-tokens default), not LLM's larger offline
    # one: the ratio is meant to isolate what serving costs over the same engine schedule.
    llm = LLM(
        "tiny",
        device="cpu",
        max_num_seqs=concurrency,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=EngineSpec.max_num_batched_tokens,
    )
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=2))
    sets = loadgen.prompt_sets(seed, concurrency, args.requests, args.prompt_len)
    # Request i of every client, then request i + 1: the order the clients send them in.
    bodies = [
        loadgen.chat_body("tiny", s[i], args.max_tokens, stream=False)
        for i in range(args.requests)
        for s in sets
    ]
    t0 = time.perf_counter()
    outs = llm.generate(bodies, params)
    wall = time.perf_counter() - t0
    return sum(len(o.token_ids) for o in outs) / wall


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        pts = [r for r in rows if r["mode"] == mode]
        xs = [r["user_tokens_per_s"] for r in pts]
        ys = [r["tokens_per_s"] for r in pts]
        ax.plot(xs, ys, "o-", label="deepring serve")
        for r, x, y in zip(pts, xs, ys, strict=True):
            ax.annotate(f"{r['concurrency']}", (x, y), textcoords="offset points", xytext=(5, 5))
        base = [r for r in pts if "offline_tokens_per_s" in r]
        if base:
            ax.plot(
                [r["offline_tokens_per_s"] / r["concurrency"] for r in base],
                [r["offline_tokens_per_s"] for r in base],
                "s--",
                label="LLM.generate (per-user = total / concurrency)",
            )
        if mode.startswith("zero-cost"):
            ax.axhline(ZERO_COST_TARGET, color="gray", ls="--", label="target")
        ax.legend()
        ax.set_xlabel("per-user speed (tokens/s per stream, 1 / median TPOT)")
        ax.set_ylabel("throughput (output tokens/s)")
        ax.set_title(f"{mode} (labels: concurrent streams)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--modes", default="zero-cost,zero-cost-paced,tiny", help=", ".join(MODES))
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt words")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="output tokens per request (default: 512 zero-cost, 64 tiny)",
    )
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--baseline-threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="runs per level (median reported)")
    args = p.parse_args()
    OUT.mkdir(exist_ok=True)
    levels = [int(c) for c in args.concurrency.split(",")]
    modes = args.modes.split(",")
    rows: list[dict] = []
    chosen = args.max_tokens
    for mode in modes:
        args.max_tokens = chosen or (64 if mode == "tiny" else 512)
        print(f"{mode}: {args.requests} requests x {args.max_tokens} tokens per client", flush=True)
        rows += bench_server(mode, args, levels)
    ratios = {
        r["concurrency"]: r["tokens_per_s"] / r["offline_tokens_per_s"]
        for r in rows
        if "offline_tokens_per_s" in r
    }
    print(f"\n{describe()}; prompts of {args.prompt_len} random words\n")
    for mode in modes:
        print(loadgen.table([r for r in rows if r["mode"] == mode], f"== {mode} =="))
        print()
    for r in rows:
        if r["mode"].startswith("zero-cost") and r["concurrency"] == 64:
            ok = r["tokens_per_s"] >= ZERO_COST_TARGET
            print(
                f"{r['mode']}, 64 streams: {r['tokens_per_s']:.0f} tok/s in "
                f"{r['events_per_s']:.0f} events/s (target >= {ZERO_COST_TARGET} tok/s: "
                f"{'met' if ok else 'MISSED'})"
            )
    for c, ratio in sorted(ratios.items()):
        row = next(r for r in rows if r["mode"] == "tiny" and r["concurrency"] == c)
        print(
            f"tiny, {c:>2} streams: serving {row['tokens_per_s']:.0f} tok/s / LLM.generate "
            f"{row['offline_tokens_per_s']:.0f} tok/s = {ratio:.2f} "
            f"(target >= {RATIO_TARGET}: {'met' if ratio >= RATIO_TARGET else 'MISSED'})"
        )
    (OUT / "serve.json").write_text(json.dumps(rows, indent=1))
    plot(rows, OUT / "serve.png")
    print(f"\nwrote {OUT / 'serve.png'} and {OUT / 'serve.json'}")


if __name__ == "__main__":
    main()
