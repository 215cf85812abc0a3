"""Streaming load against a running server (`deepring bench`, bench/serve.py).

N clients, each on its own keep-alive connection, send streaming Chat Completions requests back
to back with random prompts. Per request: TTFT (request sent -> first SSE event), TPOT ((last
event - first event) / (completion tokens - 1)), completion tokens from the final chunk's usage.
The client is a minimal HTTP/1.1 reader (chunked SSE, one JSON parse per request) so that it
takes little of the CPU it shares with the server.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

_WORDS = "alpha beta gamma delta serve token stream ring cache block window prefill decode"
_WORDS += " batch model river stone light cloud paper garden music number signal quiet green"


_VOCAB = _WORDS.split(" ")


@dataclass
class Sample:
    ok: bool
    ttft: float = 0.0
    tpot: float = 0.0
    tokens: int = 0
    events: int = 0  # SSE events received (tokens / events = tokens per event)
    error: str = ""


def random_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(words))


def prompt_sets(seed: int, clients: int, per_client: int, words: int) -> list[list[str]]:
    """The prompts each client sends, in order (the same for the same arguments)."""
    rng = random.Random(seed)
    return [[random_prompt(rng, words) for _ in range(per_client)] for _ in range(clients)]


def chat_body(model: str, prompt: str, max_tokens: int, stream: bool = True) -> dict:
    """The request the load generator sends: greedy, thinking off (so every token is content)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
        "max_tokens": max_tokens,
        "temperature": 0,
        "thinking": {"type": "disabled"},
    }


async def _read_response(reader: asyncio.StreamReader, sent: float) -> Sample:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)
    }
    if headers.get(b"transfer-encoding") != b"chunked":
        body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
        return Sample(ok=False, error=f"HTTP {status}: {body[:200].decode(errors='replace')}")
    first = last = 0.0
    n_events = 0
    usage_events = last_events = b""
    buf = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            break
        data = (await reader.readexactly(size + 2))[:-2]
        now = time.perf_counter()
        if not first:
            first = now
        last = now
        buf += data
        cut = buf.rfind(b"\n\n")
        if cut >= 0:
            events = buf[: cut + 2]
            buf = buf[cut + 2 :]
            n_events += events.count(b"\n\n")
            last_events = events[-4096:]
            # The usage arrives in the last data event before [DONE].
            if b'"usage":{' in last_events:
                usage_events = last_events
    if status != 200:
        return Sample(ok=False, error=f"HTTP {status}")
    usage = None
    for line in reversed(usage_events.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage":{' in line:
            usage = json.loads(line[6:]).get("usage")
            break
    if usage is None:
        return Sample(ok=False, error=last_events[-300:].decode(errors="replace"))
    tokens = int(usage["completion_tokens"]) if usage else 0
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return Sample(ok=True, ttft=first - sent, tpot=tpot, tokens=tokens, events=n_events)


async def _client(
    host: str, port: int, model: str, prompts: list[str], max_tokens: int, out: list[Sample]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for prompt in prompts:
            body = json.dumps(chat_body(model, prompt, max_tokens)).encode()
            req = (
                f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            ).encode() + body
            sent = time.perf_counter()
            writer.write(req)
            out.append(await _read_response(reader, sent))
    finally:
        writer.close()


async def _run(
    url: str,
    model: str,
    concurrency: int,
    per_client: int,
    prompt_len: int,
    max_tokens: int,
    seed: int,
) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    sets = prompt_sets(seed, concurrency, per_client, prompt_len)
    samples: list[Sample] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(_client(host, port, model, prompts, max_tokens, samples) for prompts in sets)
    )
    wall = time.perf_counter() - t0
    return summarize(samples, wall, concurrency)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(samples: list[Sample], wall: float, concurrency: int) -> dict:
    ok = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    tpots = [s.tpot for s in ok if s.tpot > 0]
    ttfts = [s.ttft for s in ok]
    return {
        "concurrency": concurrency,
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "first_error": next((s.error for s in samples if not s.ok), ""),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "events_per_s": sum(s.events for s in ok) / wall if wall > 0 else 0.0,
        "ttft_p50": _pct(ttfts, 0.5),
        "ttft_p99": _pct(ttfts, 0.99),
        "tpot_p50": _pct(tpots, 0.5),
        "tpot_p99": _pct(tpots, 0.99),
        "user_tokens_per_s": 1 / statistics.median(tpots) if tpots else float("nan"),
    }


def run(
    url: str,
    model: str,
    concurrency: int,
    per_client: int,
    prompt_len: int,
    max_tokens: int,
    seed: int = 0,
) -> dict:
    """One load level; returns a summary row."""
    coro = _run(url, model, concurrency, per_client, prompt_len, max_tokens, seed)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def table(rows: list[dict], title: str = "") -> str:
    head = (
        f"{'clients':>7} {'reqs':>5} {'err':>4} {'tokens':>8} {'tok/s':>9} {'ttft p50':>9} "
        f"{'ttft p99':>9} {'tpot p50':>9} {'tpot p99':>9} {'user tok/s':>10} {'events/s':>9}"
    )
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['concurrency']:>7} {r['requests']:>5} {r['errors']:>4} {r['tokens']:>8} "
            f"{r['tokens_per_s']:>9.0f} "
            f"{r['ttft_p50'] * 1e3:>7.1f}ms {r['ttft_p99'] * 1e3:>7.1f}ms "
            f"{r['tpot_p50'] * 1e3:>7.2f}ms {r['tpot_p99'] * 1e3:>7.2f}ms "
            f"{r['user_tokens_per_s']:>10.1f} {r['events_per_s']:>9.0f}"
        )
        if r["errors"]:
            lines.append(f"        first error: {r['first_error'][:200]}")
    return "\n".join(lines)
