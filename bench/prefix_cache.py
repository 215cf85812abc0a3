"""Prefix-cache benchmark: a multi-turn agent workload through `deepring serve` (tiny, CPU).

S sessions x T turns. Each session starts with its own system prompt and every turn adds a
tool result of a few hundred tokens plus the assistant's previous answer, so contexts grow to
several thousand tokens. Turns run in lockstep (all sessions' turn t, C at a time). Half-way
the server is restarted on the same cache directory: the second half must hit the directory
store (blocks and ring snapshots written before the restart). The same workload then runs on a
server with --no-prefix-cache.

Reported: prompt tokens computed (uncached) against submitted, the cached share per turn (from
the usage each response reports), hits per tier (the workers' counters before and after the
restart), TTFT p50/p99 per turn with and without the cache, and the directory store's and
Redis's block read/write rates for the tiny model's and V4-Flash's block sizes.

Targets: >= 90% of prompt tokens served from cache from turn 2 on (also right after the
restart); TTFT p50 at the last turn >= 5x lower with the cache than without.
Usage: python bench/prefix_cache.py [--sessions 32] [--turns 10] [--tool-words 120]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _machine import describe
from serve import Server

OUT = Path(__file__).parent / "out"
HIT_TARGET = 0.90
TTFT_TARGET = 5.0
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho"


def _text(rng: random.Random, words: int) -> str:
    vocab = WORDS.split() + [f"w{i}" for i in range(400)]
    return " ".join(rng.choice(vocab) for _ in range(words))


class Session:
    def __init__(self, i: int, seed: int, tool_words: int, system_words: int) -> None:
        self.rng = random.Random(seed * 1000 + i)
        self.tool_words = tool_words
        self.messages = [
            {"role": "system", "content": f"Session {i}. " + _text(self.rng, system_words)},
            {"role": "user", "content": "Start the task."},
        ]

    def add_turn(self, answer: str) -> None:
        self.messages.append({"role": "assistant", "content": answer or "ok"})
        self.messages.append(
            {"role": "user", "content": "Tool output:\n" + _text(self.rng, self.tool_words)}
        )


def _request(url: str, messages: list, max_tokens: int) -> dict:
    """One streamed chat turn: TTFT, the answer, the usage."""
    u = urllib.parse.urlparse(url)
    body = json.dumps(
        {
            "model": "tiny",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "thinking": {"type": "disabled"},
        }
    )
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    ttft, text, usage = None, [], None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                text.append(piece)
        if ev.get("usage"):
            usage = ev["usage"]
    conn.close()
    return {"ttft": ttft or time.perf_counter() - t0, "text": "".join(text), "usage": usage}


def _health(url: str) -> dict:
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/health")
    out = json.loads(conn.getresponse().read())
    conn.close()
    return out


def _tiers(url: str) -> dict:
    keys = ("hit_blocks_device", "hit_blocks_host", "hit_blocks_store", "ring_hits",
            "ring_misses", "replayed_tokens", "hit_tokens")  # fmt: skip
    out = dict.fromkeys(keys, 0)
    for w in _health(url)["workers"]:
        for k in keys:
            out[k] += w.get("prefix_cache", {}).get(k, 0)
    return out


def run_workload(args, extra: list[str], cache_dir: Path, label: str) -> dict:
    sessions = [
        Session(i, args.seed, args.tool_words, args.system_words) for i in range(args.sessions)
    ]
    server_args = [*extra, "--max-model-len", str(args.max_model_len), "--max-num-seqs", "16"]
    env_dir = str(cache_dir)
    turns, tiers = [], []

    def start() -> Server:
        os.environ["DEEPRING_CACHE_DIR"] = env_dir
        return Server(server_args, OUT / f"prefix-cache-{label}.log")

    server = start()
    try:
        _request(server.url, [{"role": "user", "content": "warm up"}], 2)
        for t in range(args.turns):
            if t == args.turns // 2 and args.restart:
                tiers.append(_tiers(server.url))
                server.stop()
                server = start()
            url = server.url
            with ThreadPoolExecutor(args.concurrency) as pool:
                res = list(
                    pool.map(lambda s, u=url: _request(u, s.messages, args.max_tokens), sessions)
                )
            for s, r in zip(sessions, res, strict=True):
                s.add_turn(r["text"])
            prompt = sum(r["usage"]["prompt_tokens"] for r in res)
            cached = sum(r["usage"].get("prompt_cache_hit_tokens", 0) for r in res)
            ttfts = sorted(r["ttft"] for r in res)
            row = {
                "turn": t + 1,
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "hit_rate": cached / prompt,
                "ttft_p50": statistics.median(ttfts),
                "ttft_p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
                "mean_context": prompt / len(res),
            }
            turns.append(row)
            print(
                f"  {label} turn {t + 1:2d}: context {row['mean_context']:6.0f} tok, "
                f"cached {row['hit_rate']:6.1%}, TTFT p50 {row['ttft_p50'] * 1e3:7.0f} ms "
                f"p99 {row['ttft_p99'] * 1e3:7.0f} ms",
                flush=True,
            )
        tiers.append(_tiers(server.url))
    finally:
        server.stop()
    return {"turns": turns, "tiers": tiers}


def store_rates(redis_url: str | None, seconds: float = 1.0) -> list[dict]:
    """Blocks/s a persistent tier writes and reads, batches of 32, for the tiny model's block
    record (bf16, 15.5 kB) and V4-Flash's (bf16, 1.1 MB)."""
    from deepring.cache.store import DirectoryStore, open_store

    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="deepring-bench-kv-"))
    stores = [("directory", DirectoryStore(tmp))]
    if redis_url:
        stores.append(("redis", open_store(redis_url)))
    for name, store in stores:
        for label, size in (("tiny", 15_488), ("V4-Flash", 1_095_680)):
            rng = random.Random(size)
            value = rng.randbytes(size)
            batch = 32 if size < 100_000 else 4
            wrote = read = 0
            keys: list[bytes] = []
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                ks = [rng.randbytes(32) for _ in range(batch)]
                wrote += store.put_many([(k, value, 600.0) for k in ks])
                keys += ks
            w_rate = wrote / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                i = rng.randrange(max(1, len(keys) - batch))
                read += sum(v is not None for v in store.get_many(keys[i : i + batch]))
            r_rate = read / (time.perf_counter() - t0)
            rows.append({"store": name, "block": label, "bytes": size, "write": w_rate,
                         "read": r_rate})  # fmt: skip
            print(f"  {name:9s} {label:8s} block: write {w_rate:8.0f} blocks/s, "
                  f"read {r_rate:8.0f} blocks/s", flush=True)  # fmt: skip
            store.clear()
        store.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _redis() -> tuple[subprocess.Popen | None, str | None]:
    exe = shutil.which("redis-server")
    if exe is None:
        print("  (redis-server not found: Redis rates skipped)")
        return None, None
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    return proc, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--system-words", type=int, default=1500, help="words of system prompt")
    p.add_argument("--tool-words", type=int, default=120, help="words of tool output per turn")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-restart", dest="restart", action="store_false")
    p.add_argument("--skip-cold", action="store_true", help="skip the --no-prefix-cache run")
    args = p.parse_args()
    OUT.mkdir(exist_ok=True)
    print(describe())
    # The greedy head is orthogonal to caching, but on CPUs where oneDNN's int8 GEMM is slow
    # (AMD without AMX: ~0.35 s per call, see issue 25) it dominates every TTFT; bf16 unless
    # the caller chose.
    os.environ.setdefault("DEEPRING_GREEDY_HEAD", "bf16")
    print(f"greedy head: {os.environ['DEEPRING_GREEDY_HEAD']} (DEEPRING_GREEDY_HEAD)")
    cache_dir = Path(tempfile.mkdtemp(prefix="deepring-bench-cache-"))
    # The embedded model's weights are generated once into the cache directory.
    result = {"with_cache": run_workload(args, [], cache_dir, "cache")}
    if not args.skip_cold:
        result["without_cache"] = run_workload(args, ["--no-prefix-cache"], cache_dir, "no-cache")
    proc, url = _redis()
    try:
        result["store_rates"] = store_rates(url)
    finally:
        if proc is not None:
            proc.kill()
    shutil.rmtree(cache_dir, ignore_errors=True)

    turns = result["with_cache"]["turns"]
    later = turns[1:]
    prompt = sum(r["prompt_tokens"] for r in turns)
    cached = sum(r["cached_tokens"] for r in turns)
    hit_later = sum(r["cached_tokens"] for r in later) / max(
        1, sum(r["prompt_tokens"] for r in later)
    )
    after = turns[args.turns // 2] if args.restart and args.turns > 1 else None
    print(f"\nprompt tokens {prompt}, computed {prompt - cached} ({1 - cached / prompt:.1%})")
    print(f"cached share from turn 2 on: {hit_later:.1%} (target >= {HIT_TARGET:.0%})")
    if after is not None:
        print(f"right after the restart (turn {after['turn']}): {after['hit_rate']:.1%}")
    for i, t in enumerate(result["with_cache"]["tiers"]):
        print(f"tiers {'before' if i == 0 and args.restart else 'after'} restart: {t}")
    if "without_cache" in result:
        last_c = turns[-1]["ttft_p50"]
        last_n = result["without_cache"]["turns"][-1]["ttft_p50"]
        print(
            f"TTFT p50 at the last turn: {last_c * 1e3:.0f} ms with the cache, "
            f"{last_n * 1e3:.0f} ms without: {last_n / last_c:.1f}x (target >= {TTFT_TARGET}x)"
        )
    (OUT / "prefix_cache.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
