"""`deepring` command line: serve | frontend | prefill | decode | generate | bench | simulate |
kv-store | ring-keys | conformance."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import deepring_recipe

from deepring import __version__


def _version_line() -> str:
    return f"deepring {__version__} (deepring-recipe {deepring_recipe.__version__})"


def _generate(args: argparse.Namespace) -> int:
    import json

    from deepring import LLM, SamplingParams

    prompts: list = []
    for kind, value in args.items or []:  # in command-line order
        if kind == "text":
            prompts.append(value)
        elif kind == "ids":
            try:
                prompts.append([int(t) for t in value.replace(",", " ").split()])
            except ValueError:
                print(f"--ids takes comma-separated integers, got {value!r}", file=sys.stderr)
                return 2
        else:
            text = Path(value[1:]).read_text(encoding="utf-8") if value.startswith("@") else value
            try:
                prompts.append(json.loads(text))
            except json.JSONDecodeError as e:
                print(f"--chat takes a JSON request body (or @file): {e}", file=sys.stderr)
                return 2
    if not prompts:
        prompts = [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        print("no prompts: pass --prompt, --ids or --chat, or lines on stdin", file=sys.stderr)
        return 2
    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty,
            seed=args.seed,
            max_tokens=args.max_tokens,
            ignore_eos=args.ignore_eos,
            logprobs=args.logprobs,
        )
        llm = LLM(
            args.model,
            device=args.device,
            dtype=args.dtype,
            load_format=args.load_format,
            quantised=args.quantised,
            speculative=args.speculative,
        )
        outputs = llm.generate(prompts, params)
    except ValueError as e:
        print(f"deepring generate: {e}", file=sys.stderr)
        return 2
    for out in outputs:
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt_token_ids": out.prompt_token_ids,
                        "token_ids": out.token_ids,
                        "text": out.text,
                        "finish_reason": out.finish_reason,
                        **({"logprobs": out.logprobs} if out.logprobs is not None else {}),
                    },
                    ensure_ascii=False,
                )
            )
        else:
            print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    return 0


def _add_generate(sub: argparse._SubParsersAction) -> None:
    from deepring.cli_serve_args import add_quantised_arg

    p = sub.add_parser("generate", help="offline generation from the command line")
    p.add_argument(
        "--model",
        default="tiny",
        help="model path or an embedded model: 'tiny' (the default, random weights), "
        "'tiny-trained' (trained on the Python standard library) or 'v41-tiny' (a DeepSeek "
        "V4.1, random weights)",
    )
    for flags, kind, text in [
        (("-p", "--prompt"), "text", "a text prompt (repeatable)"),
        (("--ids",), "ids", "a prompt as comma-separated token ids (repeatable)"),
        (("--chat",), "chat", "a Chat Completions body, JSON or @file (repeatable)"),
    ]:
        p.add_argument(
            *flags, dest="items", action="append", help=text, type=lambda v, k=kind: (k, v)
        )
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument(
        "--logprobs", type=int, default=None, metavar="K",
        help="with --json: each token's log probability and its K (0-20) likeliest alternatives",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: auto)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    add_quantised_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON object per prompt")
    p.add_argument(
        "--speculative",
        default="off",
        metavar="MODE",
        help="off (default) | mtp | fixed:N | dspark: same output, drafted and verified",
    )
    p.set_defaults(func=_generate)


def build_parser() -> argparse.ArgumentParser:
    from deepring import cli_conformance, cli_kv_store, cli_sched, cli_security, cli_serve

    parser = argparse.ArgumentParser(prog="deepring", description=__doc__)
    parser.add_argument("--version", action="version", version=_version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli_serve.add_serving_commands(sub)
    _add_generate(sub)
    cli_serve.add_bench_command(sub)
    cli_sched.add_simulate_command(sub)
    cli_kv_store.add_kv_store_command(sub)
    cli_security.add_ring_keys_command(sub)
    cli_conformance.add_conformance_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
