"""/health latency while long prompts are being prepared (issue 18): `deepring serve --zero-cost`
(no model compute, so what is measured is the frontend) with a context long enough that 8 MB
prompts are converted and encoded, not refused by the length bound.

A poller asks /health every 10 ms over a fresh connection: first on the idle server (the
baseline), then while `--clients` threads each post `--prompts` chat requests of `--mb` MB
(max_tokens 1). Prints p50 / p99 / max of both phases and the loaded / idle ratio of p99;
target: the loaded p99 under 100 ms.

Usage: python bench/health_latency.py [--clients 16] [--prompts 1] [--mb 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlsplit

from _machine import describe
from serve import OUT, Server

TARGET_MS = 100.0
WORDS = ("alpha", "beta", "gamma", "delta", "token", "cache", "prefix", "model", "serve", "ring")


def _body(mb: float, seed: int) -> bytes:
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(int(mb * 200_000)))[: int(mb * 1e6)]
    msg = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    return json.dumps(msg).encode()


def _health_ms(host: str, port: int) -> float:
    t = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=30)
    try:
        c.request("GET", "/health")
        c.getresponse().read()
    finally:
        c.close()
    return (time.perf_counter() - t) * 1e3


def _poll(host: str, port: int, until: threading.Event, out: list[float]) -> None:
    deadline = time.monotonic() + 600  # bounded whatever the load does
    while not until.is_set() and time.monotonic() < deadline:
        out.append(_health_ms(host, port))
        time.sleep(0.01)


def _post(host: str, port: int, body: bytes, statuses: list[int]) -> None:
    c = http.client.HTTPConnection(host, port, timeout=300)
    try:
        c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        statuses.append(r.status)
    finally:
        c.close()


def _stats(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=100) if len(ms) >= 2 else ms * 99
    return f"p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms, max {max(ms):.1f} ms ({len(ms)} polls)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompts", type=int, default=1, help="requests per client")
    p.add_argument("--mb", type=float, default=8.0)
    args = p.parse_args()
    print(describe())
    OUT.mkdir(exist_ok=True)
    bodies = [_body(args.mb, i) for i in range(args.clients)]
    server = Server(["--zero-cost", "--max-model-len", str(int(args.mb * 400_000)),
                     "--max-num-seqs", str(args.clients)], OUT / "health_latency.log")  # fmt: skip
    try:
        u = urlsplit(server.url)
        host, port = u.hostname, u.port
        idle: list[float] = []
        stop = threading.Event()
        poller = threading.Thread(target=_poll, args=(host, port, stop, idle))
        poller.start()
        time.sleep(3)
        stop.set()
        poller.join()

        loaded: list[float] = []
        statuses: list[int] = []
        stop = threading.Event()
        poller = threading.Thread(target=_poll, args=(host, port, stop, loaded))
        poller.start()
        t = time.perf_counter()
        clients = [
            threading.Thread(
                target=lambda b=b: [_post(host, port, b, statuses) for _ in range(args.prompts)]
            )
            for b in bodies
        ]
        for c in clients:
            c.start()
        for c in clients:
            c.join(600)
        wall = time.perf_counter() - t
        stop.set()
        poller.join()
    finally:
        server.stop()
    ok = sum(s == 200 for s in statuses)
    print(f"{args.clients} clients x {args.prompts} prompts of {args.mb:g} MB: {ok} answered 200 "
          f"of {len(statuses)} in {wall:.1f} s")  # fmt: skip
    print(f"/health idle:   {_stats(idle)}")
    print(f"/health loaded: {_stats(loaded)}")
    p99 = statistics.quantiles(loaded, n=100)[98]
    ratio = p99 / statistics.quantiles(idle, n=100)[98]
    verdict = "met" if p99 < TARGET_MS else "MISSED"
    print(f"loaded / idle p99: {ratio:.1f}x; loaded p99 {p99:.1f} ms (target < {TARGET_MS:.0f} "
          f"ms: {verdict})")  # fmt: skip


if __name__ == "__main__":
    main()
