"""Stream processing: deepring_recipe against deepseek-recipe 0.2.0 in one run.

A 3k-token DeepSeek V4.1 output (about 2k tokens of reasoning, `</think>`, a content line, five
tool calls with string, integer and object parameters) is pushed through `StreamProcessor` for
each protocol (Chat Completions, Responses, Messages), in these modes:

- tokens: one `InferenceChunk.tokens([id])` per push (decoded by the library);
- tokens+json: the same, calling `to_json()` on every event (what a server sends);
- text: one pre-decoded `InferenceChunk.text(piece, 1)` per token;
- batch64 / batch-all: 64 ids per push, and the whole output in one push.

Each run includes the chunk generator and processor setup (from an already converted request)
and the creation of the InferenceChunk objects. tokens/s = output tokens / best wall time of
`--repeats` timed loops of at least `--min-seconds` each. Prints a table (ours, official, ratio
against the 2x target on token ids) and writes bench/out/stream.png.

Usage: python bench/stream.py [--repeats 3] [--min-seconds 1.0] [--modes tokens,text,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import deepring_recipe as ours
import deepseek_recipe as official
from _machine import describe

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "out"
TOKENIZER = Path(
    os.environ.get(
        "DEEPRING_TEST_TOKENIZER", ROOT / "target" / "test-fixtures" / "deepseek-v41-tokenizer.json"
    )
)
PROTOCOLS = ("chat", "responses", "messages")
MODES = ("tokens", "tokens+json", "text", "batch64", "batch-all")
TARGET = 2.0
D = "｜DSML｜"


def tools() -> list[dict]:
    return [
        {
            "name": f"tool_{i}",
            "description": f"Tool number {i}.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "filters": {"type": "object", "properties": {"lang": {"type": "string"}}},
                },
            },
        }
        for i in range(10)
    ]


def model_output(tokenizer) -> str:
    """About 2k tokens of reasoning, a content line and five tool calls (V4.1 spelling)."""
    sentences = [
        "The user asks for several lookups, so I should plan the calls carefully.",
        "First I check which tools take a query string and which need filters.",
        "Limits must be integers; the filter object carries a language code.",
        "Some results may be in Chinese (中文结果) or Japanese (日本語の結果), which is fine.",
        "I will call five tools and then summarise the answers for the user.",
    ]
    reasoning = ""
    i = 0
    while len(tokenizer.encode(reasoning)) < 2550:
        reasoning += sentences[i % len(sentences)] + (" " if i % 4 else "\n\n")
        i += 1
    calls = []
    for k in range(5):
        params = (
            f'<{D} parameter name="query" string="true">weather in city {k}, "quoted" '
            f"and escaped \\ text 日本 {k}</{D} parameter>\n"
            f'<{D} parameter name="limit" string="false">{10 + k}</{D} parameter>\n'
            f'<{D} parameter name="filters" string="false">{{"lang": "en", "k": {k}}}'
            f"</{D} parameter>\n"
        )
        calls.append(f'<{D} invoke name="tool_{k}">\n{params}</{D} invoke>\n')
    return (
        reasoning.strip()
        + "</think>I will look these up now.\n\n"
        + f"<{D} calls>\n"
        + "".join(calls)
        + f"</{D} calls>"
    )


def text_pieces(tokenizer_json: Path, ids: list[int]) -> list[str]:
    """The text of each token as an incremental decoder would emit it (complete characters)."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in alphabet:
            alphabet[b] = chr(256 + shift)
            shift += 1
    decode = {c: b for b, c in alphabet.items()}
    raw = {
        i: bytes(decode[c] for c in t)
        for t, i in data["model"]["vocab"].items()
        if all(c in decode for c in t)
    }
    for t in data["added_tokens"]:
        raw[t["id"]] = t["content"].encode()
    pieces, pending = [], b""
    for i in ids:
        pending += raw[i]
        for cut in range(len(pending), -1, -1):
            try:
                text = pending[:cut].decode()
            except UnicodeDecodeError:
                continue
            pieces.append(text)
            pending = pending[cut:]
            break
    return pieces


class Setup:
    """A converted request per protocol, ready for `chunk_generator` in each run."""

    def __init__(self, M, tokenizer_path: Path) -> None:
        self.M = M
        self.tokenizer = M.Tokenizer.from_file(str(tokenizer_path))
        self.requests = {}
        messages = [{"role": "user", "content": "Look these up."}]
        chat_tools = [{"type": "function", "function": t} for t in tools()]
        bodies = {
            "chat": {"model": "DeepSeek-V4.1-Flash", "messages": messages, "tools": chat_tools},
            "responses": {
                "model": "DeepSeek-V4.1-Flash",
                "input": "Look these up.",
                "tools": [{"type": "function", **t} for t in tools()],
            },
            "messages": {
                "model": "DeepSeek-V4.1-Flash",
                "max_tokens": 8000,
                "messages": messages,
                "tools": [
                    {
                        "name": t["name"],
                        "description": t["description"],
                        "input_schema": t["parameters"],
                    }
                    for t in tools()
                ],
            },
        }
        chat = M.ChatCompletionRequest(bodies["chat"]).convert(M.ConversionOptions())
        for protocol, body in bodies.items():
            cls = getattr(
                M,
                {
                    "chat": "ChatCompletionRequest",
                    "responses": "ResponsesRequest",
                    "messages": "MessagesRequest",
                }[protocol],
                None,
            )
            if cls is not None and hasattr(cls, "chunk_generator"):
                converted = cls(body).convert(M.ConversionOptions())
                self.requests[protocol] = (cls, converted)
            else:
                # Before this package has the Responses / Messages request classes: the same
                # parsing options (those of the Chat conversion: thinking, tools).
                self.requests[protocol] = (None, chat)

    def generator(self, protocol: str):
        M = self.M
        cls, converted = self.requests[protocol]
        if cls is not None:
            return cls.chunk_generator(converted, "resp_1", "model-x"), converted.parsing_options
        if protocol == "responses":
            g = M.ResponsesChunkGenerator._for_request(converted, "resp_1", "model-x")
        else:
            g = M.MessagesChunkGenerator("resp_1", "model-x", True)
        return g, converted.parsing_options


def one_run(setup: Setup, protocol: str, mode: str, ids: list[int], pieces: list[str]) -> int:
    M = setup.M
    generator, parsing = setup.generator(protocol)
    p = M.StreamProcessor(generator, parsing, setup.tokenizer)
    events = 0
    tokens, text = M.InferenceChunk.tokens, M.InferenceChunk.text
    if mode in ("tokens", "tokens+json"):
        dump = mode == "tokens+json"
        for i in ids:
            out = p.push(tokens([i]))
            events += len(out)
            if dump:
                for e in out:
                    e.to_json()
    elif mode == "text":
        for s in pieces:
            events += len(p.push(text(s, 1)))
    else:
        size = 64 if mode == "batch64" else len(ids)
        for k in range(0, len(ids), size):
            events += len(p.push(tokens(ids[k : k + size])))
    events += len(p.push(M.InferenceChunk.finish(M.InferenceFinishReason.Stop)))
    return events


def measure(setup, protocol, mode, ids, pieces, repeats, min_seconds) -> tuple[float, int]:
    one_run(setup, protocol, mode, ids, pieces)  # warm-up
    best = float("inf")
    events = 0
    for _ in range(repeats):
        n = 0
        start = time.perf_counter()
        while True:
            events = one_run(setup, protocol, mode, ids, pieces)
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = min(best, elapsed / n)
    return len(ids) / best, events


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['protocol']}\n{r['mode']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    ax.bar(
        [i - 0.2 for i in x],
        [r["official"] / 1e3 for r in rows],
        0.4,
        label="deepseek-recipe 0.2.0",
    )
    ax.bar([i + 0.2 for i in x], [r["ours"] / 1e3 for r in rows], 0.4, label="deepring_recipe")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("k tokens / s")
    ax.set_yscale("log")
    ax.set_title("Stream processing, 3k-token output with reasoning and 5 tool calls")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    if not TOKENIZER.exists():
        sys.exit(f"fixture tokenizer {TOKENIZER} missing: python tests/fixtures/v41_tokenizer.py")
    setups = {"ours": Setup(ours, TOKENIZER), "official": Setup(official, TOKENIZER)}
    text = model_output(setups["official"].tokenizer)
    ids = setups["official"].tokenizer.encode(text)
    pieces = text_pieces(TOKENIZER, ids)
    assert "".join(pieces) == text
    print(f"output: {len(ids)} tokens, {len(text)} characters\n{describe()}")
    rows = []
    header = (
        f"{'protocol':<10} {'mode':<12} {'ours tok/s':>12} {'official':>12} {'ratio':>7} events"
    )
    print(header)
    print("-" * len(header))
    for protocol in args.protocols.split(","):
        for mode in args.modes.split(","):
            o, oe = measure(
                setups["ours"], protocol, mode, ids, pieces, args.repeats, args.min_seconds
            )
            f, fe = measure(
                setups["official"], protocol, mode, ids, pieces, args.repeats, args.min_seconds
            )
            rows.append({"protocol": protocol, "mode": mode, "ours": o, "official": f})
            print(f"{protocol:<10} {mode:<12} {o:>12,.0f} {f:>12,.0f} {o / f:>6.2f}x {oe}/{fe}")
    token_rows = [r for r in rows if r["mode"] == "tokens"]
    if token_rows:
        worst = min(r["ours"] / r["official"] for r in token_rows)
        verdict = "meets" if worst >= TARGET else "misses"
        print(f"\none token id per push: worst ratio {worst:.2f}x ({verdict} {TARGET:.0f}x)")
    if not args.no_plot:
        path = OUT / "stream.png"
        plot(rows, path)
        print(f"plot: {path}")


if __name__ == "__main__":
    main()
