"""Scheduling flags of the serving commands (chunk sizes from a latency target, the router) and
`deepring simulate` (the cluster simulator, sim/)."""

from __future__ import annotations

import argparse
import sys

from deepring.config import ROUTERS, EngineSpec


def add_pacing_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scheduling (docs/configuration.md)")
    g.add_argument(
        "--tbt-target",
        type=float,
        default=None,
        metavar="MS",
        help="time-between-tokens target: a step that carries decode tokens takes the largest "
        "prefill chunk whose predicted step time (the worker's fitted step-time model) stays "
        "under it; --max-num-batched-tokens stays the cap (default: none, the token budget "
        "alone sizes chunks)",
    )
    g.add_argument(
        "--ttft-target",
        type=float,
        default=None,
        metavar="MS",
        help="with --tbt-target: a prompt that would miss this first-token deadline in "
        "TBT-sized chunks gets larger ones (up to the token budget)",
    )
    g.add_argument(
        "--min-chunk-tokens",
        type=int,
        default=EngineSpec.min_chunk_tokens,
        metavar="N",
        help="with --tbt-target: the prefill chunk of a step whose decode tokens alone exceed "
        "the target (default 16: prompts never starve)",
    )


def pacing_settings(args: argparse.Namespace) -> dict:
    """The EngineSpec fields of add_pacing_args."""
    return {
        "tbt_target_ms": args.tbt_target,
        "ttft_target_ms": args.ttft_target,
        "min_chunk_tokens": args.min_chunk_tokens,
    }


def add_router_args(p: argparse.ArgumentParser, tbt_target: bool = False) -> None:
    """--router (and, for a frontend without engine flags, --tbt-target)."""
    g = p.add_argument_group("routing (docs/configuration.md)")
    g.add_argument(
        "--router",
        choices=ROUTERS,
        default="cost",
        help="cost: prefill by predicted completion time and decode by slots, KV blocks and "
        "predicted step time, from the workers' step-time models and load reports; tokens: "
        "prefill by queued prompt tokens, decode by free slots and blocks (default cost)",
    )
    if tbt_target:
        g.add_argument(
            "--tbt-target",
            type=float,
            default=None,
            metavar="MS",
            help="the decode workers' TBT target: the cost router weighs their predicted step "
            "times against it (default: their mean full-batch step)",
        )


def add_simulate_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a request trace on a simulated cluster (the real scheduler and routers, "
        "a step-time model for the time)",
    )
    p.add_argument("--prefill", type=int, default=16, help="prefill workers")
    p.add_argument("--decode", type=int, default=64, help="decode workers")
    p.add_argument(
        "--model", default="h800", help="step-time model: h800 | tiny-cpu (cost.presets)"
    )
    p.add_argument("--router", choices=[*ROUTERS, "both"], default="both")
    p.add_argument("--tbt-target", type=float, default=None, metavar="MS")
    p.add_argument("--ttft-target", type=float, default=None, metavar="MS")
    p.add_argument("--slo-ttft", type=float, default=2000.0, metavar="MS", help="TTFT SLO")
    p.add_argument("--slo-tbt", type=float, default=100.0, metavar="MS", help="TBT SLO")
    p.add_argument("--sessions", type=int, default=2000, help="conversations in the trace")
    p.add_argument("--rate", type=float, default=None, help="sessions per second (default: "
                   "sized to load the cluster at --load)")  # fmt: skip
    p.add_argument("--load", type=float, default=0.7, help="target utilisation for --rate")
    p.add_argument("--max-num-seqs", type=int, default=128, help="decode batch slots")
    p.add_argument("--prefill-budget", type=int, default=8192, help="prefill step tokens")
    p.add_argument("--decode-budget", type=int, default=2048, help="decode step tokens")
    p.add_argument("--stragglers", type=float, default=0.0,
                   help="fraction of workers that run slower")  # fmt: skip
    p.add_argument("--straggler-factor", type=float, default=1.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="instead: measure the tiny model's steps on this machine and print its fit",
    )
    p.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from deepring.sim import cli

    try:
        return cli.run(args)
    except ValueError as e:
        print(f"deepring simulate: {e}", file=sys.stderr)
        return 2
