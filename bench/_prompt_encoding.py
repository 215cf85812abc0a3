"""Prompt encoding: deepring_recipe against deepseek-recipe 0.2.0 and HF `tokenizers`, one run.

The same text (English prose, code, numbers, CJK and emoji, generated from a fixed seed) is
rendered as a V4.1 conversation in two shapes and encoded to token ids:

- one: the whole text as a single user message;
- split64: the same text split over 64 alternating user / assistant messages;

at about 1k, 32k and 256k tokens. Encoders:

- ours: `DeepseekV41Encoding().with_tokenizer(t).encode(conversation)` (special ranges become
  their ids, text segments are encoded in parallel and long segments split at safe points);
- official: the same call on deepseek-recipe;
- hf: HF `tokenizers` (Python) encoding each plain-text segment of the rendered prompt in order,
  without special-token matching — the sequential baseline our parallel result must equal.

All three must produce the same ids (checked). tokens/s = prompt tokens / best wall time of
`--repeats` runs. Then ours is measured again at 1, 2, ... every core, and a plot of tokens/s
against threads is written to bench/out/tokenize.png.

This file is the implementation of bench/tokenize.py. Usage:
    python bench/tokenize.py [--repeats 3] [--sizes 1k,32k,256k] [--no-plot]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import deepring_recipe as ours
import deepseek_recipe as official
import tokenizers
from _machine import describe

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "out"
TOKENIZER = Path(
    os.environ.get(
        "DEEPRING_TEST_TOKENIZER", ROOT / "target" / "test-fixtures" / "deepseek-v41-tokenizer.json"
    )
)
SIZES = {"1k": 1_000, "32k": 32_000, "256k": 256_000}
TARGETS = {"one": 1.7, "split64": 1.2}  # at 256k, against the official

WORDS = [
    "the", "model", "serves", "requests", "from", "many", "clients", "while", "scheduler",
    "keeps", "every", "batch", "full", "and", "cache", "holds", "blocks", "of", "keys", "values",
]  # fmt: skip
CODE = [
    "def handler(request):\n    return {'status': 200, 'body': request.json()}\n",
    "for (int i = 0; i < n; ++i) { sum += values[i] * weights[i]; }\n",
    "SELECT id, name FROM users WHERE created_at > '2026-01-01' ORDER BY id;\n",
]
CJK = ["模型正在处理请求。", "キャッシュは再利用されます。", "한국어 문장도 포함됩니다.", "😀🚀✨"]


def make_text(target_tokens: int, tokenizer: tokenizers.Tokenizer, seed: int = 7) -> str:
    """Deterministic mixed text of about `target_tokens` tokens."""
    rng = random.Random(seed)
    parts: list[str] = []
    while True:
        for _ in range(400):
            r = rng.random()
            if r < 0.75:
                sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18)))
                parts.append(sentence.capitalize() + ". ")
            elif r < 0.85:
                parts.append("\n" + rng.choice(CODE))
            elif r < 0.95:
                parts.append(rng.choice(CJK))
            else:
                parts.append(f"{rng.randint(0, 10**9)} items, {rng.random():.4f} ratio.\n\n")
        text = "".join(parts)
        n = len(tokenizer.encode(text, add_special_tokens=False).ids)
        if n >= target_tokens:
            # trim proportionally to the target
            return text[: int(len(text) * target_tokens / n)]


def conversation(M, text: str, messages: int):
    if messages == 1:
        return M.Conversation(messages=[M.UserMessage(text)], thinking_mode=True)
    step = len(text) // messages
    out = []
    for i in range(messages):
        piece = text[i * step : (i + 1) * step if i + 1 < messages else len(text)]
        out.append(M.UserMessage(piece) if i % 2 == 0 else M.AssistantMessage(piece))
    return M.Conversation(messages=out, thinking_mode=True)


def best(fn, repeats: int) -> tuple[float, object]:
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def hf_encoder(hf: tokenizers.Tokenizer, rendered):
    """Encode each plain segment of a rendered prompt with HF, special ranges by vocabulary."""
    vocab = hf.get_vocab()
    prompt = rendered.prompt
    pieces: list[tuple[bool, str]] = []
    pos = 0
    for a, b in rendered.special_ranges:
        if a > pos:
            pieces.append((False, prompt[pos:a]))
        pieces.append((True, prompt[a:b]))
        pos = b
    if pos < len(prompt):
        pieces.append((False, prompt[pos:]))

    def run() -> list[int]:
        ids: list[int] = []
        for special, text in pieces:
            if special:
                ids.append(vocab[text])
            else:
                ids.extend(hf.encode(text, add_special_tokens=False).ids)
        return ids

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()

    cores = os.cpu_count() or 1
    hf = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    # HF's own Rust pool would make the baseline parallel; it is the sequential reference.
    hf_plain = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    tok_ours = ours.Tokenizer.from_file(str(TOKENIZER))
    tok_official = official.Tokenizer.from_file(str(TOKENIZER))
    enc_ours = ours.DeepseekV41Encoding().with_tokenizer(tok_ours)
    enc_official = official.DeepseekV41Encoding().with_tokenizer(tok_official)

    print(describe())
    print(f"{'size':<6} {'shape':<8} {'tokens':>8} {'ours tok/s':>12} {'official':>12} "
          f"{'hf':>12} {'vs official':>11} {'vs hf':>6}")  # fmt: skip
    rows = []
    texts = {}
    for size in args.sizes.split(","):
        texts[size] = make_text(SIZES[size], hf_plain)
        for shape, messages in (("one", 1), ("split64", 64)):
            conv_ours = conversation(ours, texts[size], messages)
            conv_official = conversation(official, texts[size], messages)
            t_ours, ids = best(lambda c=conv_ours: enc_ours.encode(c), args.repeats)
            t_off, ids_off = best(lambda c=conv_official: enc_official.encode(c), args.repeats)
            rendered = ours.DeepseekV41Encoding().render_conversation(conv_ours)
            t_hf, ids_hf = best(hf_encoder(hf, rendered), args.repeats)
            if not (list(ids) == list(ids_off) == list(ids_hf)):
                print(f"{size}/{shape}: token ids differ between encoders", file=sys.stderr)
                return 1
            n = len(ids)
            row = {
                "size": size,
                "shape": shape,
                "tokens": n,
                "ours": n / t_ours,
                "official": n / t_off,
                "hf": n / t_hf,
            }
            rows.append(row)
            target = TARGETS[shape] if size == "256k" else None
            mark = "" if target is None else ("  ok" if t_off / t_ours >= target else "  BELOW")
            mark += f" (target {target}x)" if target else ""
            ratios = f"{t_off / t_ours:>10.2f}x {t_hf / t_ours:>5.2f}x"
            print(f"{size:<6} {shape:<8} {n:>8} {row['ours']:>12.0f} {row['official']:>12.0f} "
                  f"{row['hf']:>12.0f} {ratios}{mark}")  # fmt: skip

    scaling = []
    size = "256k" if "256k" in texts else list(texts)[-1]
    counts = sorted({1, 2, cores})
    print(f"\nthread scaling, {size} prompt (ours):")
    for shape, messages in (("one", 1), ("split64", 64)):
        conv = conversation(ours, texts[size], messages)
        for threads in counts:
            enc = ours.DeepseekV41Encoding().with_tokenizer(tok_ours.with_threads(threads))
            t, ids = best(lambda c=conv, e=enc: e.encode(c), args.repeats)
            scaling.append({"shape": shape, "threads": threads, "tokens_per_s": len(ids) / t})
            print(f"  {shape:<8} {threads:>3} threads {len(ids) / t:>12.0f} tok/s")

    OUT.mkdir(exist_ok=True)
    (OUT / "tokenize.json").write_text(json.dumps({"rows": rows, "scaling": scaling}, indent=1))
    if not args.no_plot:
        plot(scaling, counts, OUT / "tokenize.png")
        print(f"plot: {OUT / 'tokenize.png'}")
    return 0


def plot(scaling: list[dict], counts: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for shape in ("one", "split64"):
        ys = [r["tokens_per_s"] for r in scaling if r["shape"] == shape]
        ax.plot(counts, ys, marker="o", label=shape)
    ax.set_xlabel("threads")
    ax.set_ylabel("tokens/s")
    ax.set_xticks(counts)
    ax.set_title("deepring prompt encoding, 256k-token prompt")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
