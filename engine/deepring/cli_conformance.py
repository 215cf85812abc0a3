"""`deepring conformance`: property-based checks of a live OpenAI / Anthropic-compatible
server for DeepSeek V4 models (deepring.conformance)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """Runs property-based checks (hypothesis) against a live server: SSE framing and
event order, streamed vs non-streamed agreement at temperature 0, usage arithmetic, tool calls,
markup leaks, forced tool choice, JSON-schema outputs, error shapes, refusal of invalid bodies,
unknown models and oversize prompts, prefix-cache hits. Prints a property x protocol table;
exits 1 when a property fails, 2 when the run cannot start."""


def add_conformance_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "conformance", help="check a live server's protocol conformance", description=DESCRIPTION
    )
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None, help="sent as Bearer token and x-api-key")
    p.add_argument("--model", default=None, help="the model to request (default: GET /v1/models)")
    p.add_argument(
        "--protocols",
        default="chat,responses,messages",
        help="comma-separated: chat, responses, messages (default: all)",
    )
    p.add_argument(
        "--examples", type=int, default=100, help="generated examples per protocol (default 100)"
    )
    p.add_argument(
        "--bounded-examples",
        type=int,
        default=None,
        metavar="N",
        help="grammar-bounded examples per protocol (a forced tool call or a json_schema "
        "output, tens of tokens each; default: one per 20 examples, at least 6; 0: none)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="hypothesis seed (default: random, printed)"
    )
    p.add_argument("--junit", type=Path, default=None, metavar="FILE", help="write JUnit XML")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=8,
        help="output cap of the generated requests (default 8): the run's speed",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        metavar="FILE",
        help="the served model's tokenizer.json: prompt token counts are checked against "
        "deepring_recipe's rendering",
    )
    p.add_argument(
        "--template", choices=["v4", "v41"], default=None, help="the served model's prompt "
        "template, for --tokenizer (default: accept either)",
    )  # fmt: skip
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="the served context in tokens (default: max_model_len of GET /v1/models, if any)",
    )
    p.add_argument(
        "--prefix-cache",
        choices=["auto", "on", "off"],
        default="auto",
        help="whether a repeated prompt must report cached tokens: on, off, or auto (when the "
        "server reports cached counts at all)",
    )
    p.add_argument(
        "--no-seed-field",
        action="store_true",
        help="send no `seed` (an extension on Responses and Messages): streamed and "
        "non-streamed answers then agree only where the server is greedy at temperature 0",
    )
    p.add_argument(
        "--max-shrinks",
        type=int,
        default=30,
        help="examples spent minimising failures, per protocol (default 30)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="threads per protocol, each with its share of the examples (default 2)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.set_defaults(func=_conformance)


def _conformance(args: argparse.Namespace) -> int:
    try:
        from deepring.conformance.checks import Target
        from deepring.conformance.runner import PROTOCOLS, Plan, run
    except ImportError as e:
        print(
            f"deepring conformance needs {e.name}: pip install 'deepring[conformance]'",
            file=sys.stderr,
        )
        return 2
    protocols = tuple(p.strip() for p in args.protocols.split(",") if p.strip())
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown or not protocols:
        print(f"--protocols takes {', '.join(PROTOCOLS)}; got {args.protocols!r}", file=sys.stderr)
        return 2
    if args.examples < 1 or args.max_tokens < 1:
        print("--examples and --max-tokens must be >= 1", file=sys.stderr)
        return 2
    if args.concurrency < 1:
        print("--concurrency must be >= 1", file=sys.stderr)
        return 2
    if (args.bounded_examples or 0) < 0 or args.max_shrinks < 0:
        print("--bounded-examples and --max-shrinks must be >= 0", file=sys.stderr)
        return 2
    target = Target(
        base_url=args.base_url,
        api_key=args.api_key,
        model=args.model,
        max_tokens=args.max_tokens,
        seed=None if args.no_seed_field else 0,
        tokenizer=args.tokenizer,
        template=args.template,
        context_length=args.context_length,
        prefix_cache=args.prefix_cache,
        timeout=args.timeout,
    )
    plan = Plan(
        protocols,
        args.examples,
        args.seed,
        args.max_shrinks,
        args.bounded_examples,
        args.concurrency,
    )
    try:
        report = run(target, plan)
    except (ValueError, OSError) as e:
        print(f"deepring conformance: {e}", file=sys.stderr)
        return 2
    print(report.text())
    if args.junit is not None:
        args.junit.write_bytes(report.junit())
    return 1 if report.failed else 0
