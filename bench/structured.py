"""Structured output: the grammar library on our tokenizer, and decoding under a JSON Schema.

Part 1 (`--libs`, on by default): llguidance (the one the engine uses) and xgrammar (when
installed), on the V4.1 tokenizer.json the engine serves (129,281 ids): the import (in a fresh
interpreter: does it pull in torch? the frontend must stay torch-free), the tokenizer-info build,
the compile of a few JSON Schemas cold and cached, and the per-token mask time along a document
of each schema (median and p99 over its tokens).

Part 2 (`--decode`, on by default): offline `LLM` on each embedded model of `--models`
(`tiny-trained`, whose argmax a grammar mostly allows, as a trained model's; `tiny`, random
weights, whose argmax it refuses in nearly every row at every step: a stress case), greedy, at
each batch size: the same prompts unconstrained and with a JSON Schema on every request (one
whose shortest document is longer than the run, so every step is constrained), generated
tokens / wall time (median over
interleaved pairs) and the median of the pairs' ratios (target >= 0.9 at batch 32), with the
mask time per step (what the helper thread computed, and what the step waited for after the
model).

Usage: python bench/structured.py [--models tiny-trained,tiny] [--batch-sizes 1,32]
                                  [--new-tokens 48] [--repeats 6] [--no-libs] [--no-decode]
                                  [--threads N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from importlib.metadata import version

from _machine import describe

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
        },
        "required": ["name", "age"],
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string"},
                        "qty": {"type": "integer", "minimum": 1},
                        "price": {"type": "number"},
                    },
                    "required": ["sku", "qty"],
                },
            },
            "status": {"enum": ["new", "paid", "shipped"]},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["id", "items", "status"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {
                    "b": {
                        "type": "object",
                        "properties": {"c": {"type": "array", "items": {"type": "number"}}},
                    }
                },
            },
            "flag": {"type": "boolean"},
        },
    },
}
DOCS = {
    "person": {"name": "Ada Lovelace", "age": 36, "email": "ada@math.com", "tags": ["a", "c"]},
    "order": {
        "id": "o-17",
        "items": [{"sku": "x1", "qty": 2, "price": 9.5}, {"sku": "y2", "qty": 1}],
        "status": "paid",
        "note": None,
    },
    "nested": {"a": {"b": {"c": [1.5, 2, 3.25]}}, "flag": True},
}
# Part 2: at least 200 array items, so no output completes within the run. Two variants of
# the item's string: free, and bounded by maxLength (each position of a bounded string is a
# distinct lexer state for llguidance: masks cost ~1-5 ms there instead of ~15 us).
LONG = {
    "type": "object",
    "properties": {
        "rows": {
            "type": "array",
            "minItems": 200,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 999},
                    "name": {"type": "string", "maxLength": 12},
                    "ok": {"type": "boolean"},
                },
                "required": ["id", "name", "ok"],
            },
        }
    },
    "required": ["rows"],
}


LONG_FREE = json.loads(json.dumps(LONG).replace(', "maxLength": 12', ""))


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def _us(s: float) -> str:
    return f"{s * 1e6:.1f} us"


def import_probe(module: str) -> tuple[float, bool]:
    """Seconds to import `module` in a fresh interpreter, and whether torch came with it."""
    code = (
        "import sys, time; t = time.perf_counter(); import " + module + "; "
        "print(time.perf_counter() - t, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, torch_loaded = out.stdout.split()
    return float(seconds), torch_loaded == "True"


def _doc_tokens(encode, name: str) -> list[int]:
    text = json.dumps(DOCS[name], separators=(", ", ": "))
    return encode(text)


def bench_llguidance(tok_path: str, vocab: int) -> dict:
    import llguidance
    import llguidance.numpy as lnp
    from deepring.structured.build import json_schema

    out: dict = {"library": f"llguidance {version('llguidance')}"}
    out["import"] = import_probe("llguidance")
    t = time.perf_counter()
    tok = llguidance.LLTokenizer(tok_path, n_vocab=vocab, eos_token=[1])
    out["tokenizer"] = time.perf_counter() - t
    bitmask = lnp.allocate_token_bitmask(1, vocab)
    compiles, masks = {}, []
    for name, schema in SCHEMAS.items():
        t = time.perf_counter()
        grammar = json_schema(schema).grammar  # the frontend's build + validate (no tokenizer)
        validate = time.perf_counter() - t
        t = time.perf_counter()
        m = llguidance.LLMatcher(tok, grammar, log_level=0)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        m.deep_copy()  # the engine's cache hit: a copy of the compiled matcher
        cached = time.perf_counter() - t
        compiles[name] = (validate, cold, cached)
        for token in _doc_tokens(tok.tokenize_str, name):
            t = time.perf_counter()
            lnp.fill_next_token_bitmask(m, bitmask)
            masks.append(time.perf_counter() - t)
            if not m.consume_token(token):
                raise RuntimeError(f"{name}: {m.get_error()}")
    out["compile"] = compiles
    out["mask"] = masks
    out["frontend"] = "yes: torch-free, validate_grammar needs no tokenizer"
    return out


def bench_xgrammar(tok_path: str, vocab: int) -> dict | None:
    try:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    out: dict = {"library": f"xgrammar {version('xgrammar')}"}
    out["import"] = import_probe("xgrammar")
    t = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_file=tok_path)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[1])
    out["tokenizer"] = time.perf_counter() - t
    compiles, masks = {}, []
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    for name, schema in SCHEMAS.items():
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        text = json.dumps(schema)
        t = time.perf_counter()
        cg = compiler.compile_json_schema(text, any_whitespace=False, separators=(", ", ": "))
        cold = time.perf_counter() - t
        t = time.perf_counter()
        compiler.compile_json_schema(text, any_whitespace=False, separators=(", ", ": "))
        cached = time.perf_counter() - t
        compiles[name] = (None, cold, cached)
        m = xgr.GrammarMatcher(cg)
        for token in _doc_tokens(lambda s: hf.encode(s, add_special_tokens=False), name):
            t = time.perf_counter()
            m.fill_next_token_bitmask(bitmask)
            masks.append(time.perf_counter() - t)
            if not m.accept_token(token):
                raise RuntimeError(f"{name}: token {token} refused")
    out["compile"] = compiles
    out["mask"] = masks
    out["frontend"] = "no: importing it imports torch and transformers"
    return out


def report_libs(results: list[dict]) -> None:
    print("\n## grammar libraries on the served tokenizer (129,281 ids)")
    for r in results:
        seconds, torch_loaded = r["import"]
        masks = sorted(r["mask"])
        p99 = masks[min(len(masks) - 1, int(0.99 * len(masks)))]
        print(f"\n{r['library']}")
        print(f"  import (fresh interpreter): {seconds:.2f} s, torch imported: {torch_loaded}")
        print(f"  tokenizer info build: {r['tokenizer']:.2f} s")
        for name, (validate, cold, cached) in r["compile"].items():
            v = f"frontend build+validate {_ms(validate)}, " if validate is not None else ""
            print(f"  compile {name:7s}: {v}cold {_ms(cold)}, cached {_us(cached)}")
        print(
            f"  mask per token: median {_us(statistics.median(masks))}, p99 {_us(p99)} "
            f"({len(masks)} tokens)"
        )
        print(f"  usable by the torch-free frontend to validate a schema: {r['frontend']}")


def bench_decode(args, model: str) -> None:
    import torch
    from deepring import LLM, SamplingParams
    from deepring.structured.build import json_schema

    os.environ.setdefault("DEEPRING_GREEDY_HEAD", "bf16")
    head = os.environ["DEEPRING_GREEDY_HEAD"]
    print(f"\n## decode, {model}, greedy (DEEPRING_GREEDY_HEAD={head})")
    llm = LLM(
        model,
        device="cpu",
        max_num_seqs=max(args.batch_sizes),
        max_model_len=args.prompt_len + args.new_tokens + 8,
    )
    gen = torch.Generator().manual_seed(0)
    print(
        f"{'strings':>8} {'batch':>5} {'unconstrained tok/s':>20} {'constrained tok/s':>18} "
        f"{'ratio':>6} {'mask compute/step':>18} {'mask wait/step':>15}"
    )
    for (label, schema), b in itertools.product(
        (("free", LONG_FREE), ("bounded", LONG)), args.batch_sizes
    ):
        constraint = json_schema(schema)
        prompts = [
            p.tolist() for p in torch.randint(3, 120000, (b, args.prompt_len), generator=gen)
        ]
        params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
        llm.generate(
            prompts[:1], SamplingParams(temperature=0, max_tokens=4), constraints=constraint
        )
        # Interleaved pairs (the machine drifts ~10% between minutes): each pair runs both, in
        # alternating order, and the ratio reported is the median of the pairs' ratios.
        rates: dict[bool, list[float]] = {False: [], True: []}
        compute = wait = 0.0
        steps = 0
        for r in range(args.repeats):
            for constrained in (False, True) if r % 2 == 0 else (True, False):
                c = constraint if constrained else None
                masks = llm.engine.runner.masks
                before = (masks.compute_seconds, masks.seconds, masks.steps) if masks else (0, 0, 0)
                t = time.perf_counter()
                outs = llm.generate(prompts, params, constraints=c)
                dt = time.perf_counter() - t
                n = sum(len(o.token_ids) for o in outs)
                if c is not None and any(o.finish_reason != "length" for o in outs):
                    raise RuntimeError("a constrained output ended early: the schema is too short")
                rates[constrained].append(n / dt)
                if c is not None:
                    m = llm.engine.runner.masks
                    steps += m.steps - before[2]
                    compute += m.compute_seconds - before[0]
                    wait += m.seconds - before[1]
        compute /= max(1, steps)
        wait /= max(1, steps)
        ratio = statistics.median(c / u for u, c in zip(rates[False], rates[True], strict=True))
        rates = [statistics.median(rates[False]), statistics.median(rates[True])]
        flag = (
            ""
            if b != 32
            else ("  (target >= 0.9: met)" if ratio >= 0.9 else "  (target >= 0.9: MISSED)")
        )
        print(
            f"{label:>8} {b:>5} {rates[0]:>20.1f} {rates[1]:>18.1f} {ratio:>6.2f} "
            f"{_ms(compute):>18} {_ms(wait):>15}{flag}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,32")
    ap.add_argument("--models", default="tiny-trained,tiny")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=6, help="interleaved pairs per case")
    # One torch thread by default: on a shared 2-core machine a second OpenMP thread turns every
    # vocabulary-sized op into a scheduling lottery (a 129k fill took 16 ms instead of 30 us).
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--no-libs", action="store_true")
    ap.add_argument("--no-decode", action="store_true")
    args = ap.parse_args()
    args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    print(describe())
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if not args.no_libs:
        from deepring.model.tiny import tiny_model_dir

        tok_path = str(tiny_model_dir() / "tokenizer.json")
        results = [bench_llguidance(tok_path, 129281)]
        xg = bench_xgrammar(tok_path, 129281)
        if xg is not None:
            results.append(xg)
        report_libs(results)
    if not args.no_decode:
        for model in args.models.split(","):
            bench_decode(args, model)


if __name__ == "__main__":
    main()
