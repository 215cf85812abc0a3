"""Chaos benchmark: `deepring serve` (tiny, 2 prefill + 2 decode workers) under a bounded
streaming load, once fault-free and once while a random worker is killed every few seconds
(one of each role is always left alive).

Reported per run: requests, failures, output tokens/s, TTFT and TBT (time between tokens)
p50/p99, and whether every output equals the fault-free run's (greedy). Targets: no failed
request, every output identical, p99 TBT under chaos within 3x of fault-free.
Usage: python bench/chaos.py [--streams 16] [--requests 64] [--kill-every 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _machine import describe
from serve import Server

OUT = Path(__file__).parent / "out"
TBT_TARGET = 3.0


def _stream(url: str, prompt: str, max_tokens: int) -> dict:
    u = urllib.parse.urlparse(url)
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "thinking": {"type": "disabled"},
        }
    )
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    stamps, text, error = [], [], None
    if resp.status != 200:
        error = f"HTTP {resp.status}"
    for raw in resp if error is None else []:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            error = ev["error"].get("message", "error")
            break
        for ch in ev.get("choices", []):
            if ch.get("delta", {}).get("content"):
                stamps.append(time.perf_counter() - t0)
                text.append(ch["delta"]["content"])
    conn.close()
    return {"text": "".join(text), "stamps": stamps, "error": error}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(url: str, prompts: list[str], args, chaos: bool) -> dict:
    stop = threading.Event()
    kills = []

    def killer() -> None:
        rng = random.Random(args.seed)
        wait = min(1.0, args.kill_every)  # the first kill early: a short run still gets one
        while not stop.wait(wait):
            wait = args.kill_every
            health = json.loads(_get(url, "/health"))
            ready = [w for w in health["workers"] if w["up"]]
            spare = [w for w in ready if sum(x["role"] == w["role"] for x in ready) > 1]
            if spare:
                victim = rng.choice(spare)
                os.kill(victim["pid"], signal.SIGKILL)
                kills.append(victim["worker"])

    t = threading.Thread(target=killer, daemon=True)
    t0 = time.perf_counter()
    if chaos:
        t.start()
    try:
        with ThreadPoolExecutor(args.streams) as ex:
            res = list(ex.map(lambda p: _stream(url, p, args.max_tokens), prompts))
    finally:
        stop.set()
    wall = time.perf_counter() - t0
    ttft = [r["stamps"][0] for r in res if r["stamps"]]
    tbt = [b - a for r in res for a, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
    return {
        "results": res,
        "failures": sum(r["error"] is not None for r in res),
        "kills": kills,
        "tokens_per_s": sum(len(r["stamps"]) for r in res) / wall,
        "ttft_p50": statistics.median(ttft),
        "ttft_p99": _pct(ttft, 0.99),
        "tbt_p50": statistics.median(tbt),
        "tbt_p99": _pct(tbt, 0.99),
    }


def _get(url: str, path: str) -> str:
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", path)
    out = conn.getresponse().read().decode()
    conn.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--kill-every", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    OUT.mkdir(exist_ok=True)
    print(describe())
    os.environ.setdefault("DEEPRING_GREEDY_HEAD", "bf16")  # see bench/prefix_cache.py
    rng = random.Random(args.seed)
    prompts = [
        " ".join(f"w{rng.randrange(900)}" for _ in range(rng.randrange(10, 120)))
        for _ in range(args.requests)
    ]
    server = Server(
        ["--num-prefill", "2", "--num-decode", "2", "--max-num-seqs", str(args.streams)],
        OUT / "chaos.log",
    )
    try:
        _stream(server.url, "warm up", 2)
        calm = run(server.url, prompts, args, chaos=False)
        wild = run(server.url, prompts, args, chaos=True)
    finally:
        server.stop()
    pairs = zip(calm["results"], wild["results"], strict=True)
    same = sum(a["text"] == b["text"] for a, b in pairs)
    for name, r in (("fault-free", calm), ("chaos", wild)):
        print(
            f"{name:10s}: {len(prompts)} requests, {r['failures']} failed, "
            f"{r['tokens_per_s']:.0f} tok/s, TTFT p50 {r['ttft_p50'] * 1e3:.0f} ms "
            f"p99 {r['ttft_p99'] * 1e3:.0f} ms, TBT p50 {r['tbt_p50'] * 1e3:.0f} ms "
            f"p99 {r['tbt_p99'] * 1e3:.0f} ms"
        )
    ratio = wild["tbt_p99"] / calm["tbt_p99"]
    print(f"workers killed: {len(wild['kills'])} ({', '.join(wild['kills'])})")
    print(f"outputs identical to the fault-free run: {same}/{len(prompts)}")
    print(f"p99 TBT under chaos / fault-free: {ratio:.2f}x (target <= {TBT_TARGET}x)")
    for r in (calm, wild):
        r.pop("results")
    (OUT / "chaos.json").write_text(json.dumps({"fault_free": calm, "chaos": wild}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
