"""`deepring serve --ep N`: each prefill / decode worker becomes an expert-parallel group of N
rank processes (worker.ep_rank), supervised together (launcher.py).

Each rank registers with the frontend as a worker of its own (`decode-0`, `decode-1`, ...: the
ranks of group g are the workers g*N .. g*N+N-1 of the role), with its own requests, caches,
load reports and handoff endpoint. Attention is data parallel, so a rank is exactly what the
frontend already routes to and reroutes from; only the MoE layers know the group. The router
then spreads requests over the ranks as over any workers, and a rank without requests steps
idle with its group.
"""

from __future__ import annotations

import argparse

from deepring.config import EPConfig, free_tcp


def add_ep_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("expert parallel (docs/architecture.md, 'Expert parallel')")
    g.add_argument(
        "--ep",
        type=int,
        default=1,
        metavar="N",
        help="ranks per worker: each worker is an expert-parallel group of N processes, each "
        "on its own device (--devices), sharing the routed experts (default 1: none)",
    )
    g.add_argument(
        "--prefill-ep",
        type=int,
        default=None,
        metavar="N",
        help="ranks per prefill worker (default: --ep)",
    )
    g.add_argument(
        "--redundant-experts",
        type=int,
        default=0,
        metavar="K",
        help="spare expert slots per group, given to the busiest experts (E + K must divide "
        "by the group size)",
    )
    g.add_argument(
        "--rebalance-interval",
        type=int,
        default=1000,
        metavar="STEPS",
        help="group steps between rearrangements of the experts by the load they routed "
        "(0: never; default 1000)",
    )


def ranks_per_worker(args: argparse.Namespace) -> dict[str, int]:
    pre = args.ep if args.prefill_ep is None else args.prefill_ep
    return {"prefill": pre, "decode": args.ep}


def ep_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the expert-parallel options for this model, before anything
    starts (None: nothing)."""
    sizes = ranks_per_worker(args)
    if min(sizes.values()) < 1:
        return "--ep and --prefill-ep must be >= 1"
    if args.redundant_experts < 0 or args.rebalance_interval < 0:
        return "--redundant-experts and --rebalance-interval must be >= 0"
    parallel = [n for n in sizes.values() if n > 1]
    if not parallel:
        return "--redundant-experts needs --ep N > 1" if args.redundant_experts else None
    if args.zero_cost:
        return "--ep needs a model: it cannot run with --zero-cost"
    if args.speculative != "off":
        return "--ep does not run speculative decoding yet (a draft pass is one rank's alone)"
    if args.reserve_workers:
        return "--reserve-workers does not take over a rank of an --ep group yet"
    from deepring.ep.placement import check_layout
    from deepring.model.config import ModelConfig
    from deepring.model.loader import resolve_model_path

    try:
        config = ModelConfig.from_pretrained(resolve_model_path(args.model))
    except ValueError as e:
        return str(e)
    if config.model_type != "deepseek_v4":
        return f"--ep runs DeepSeek V4 MoE models; {args.model!r} is {config.model_type}"
    for n in parallel:
        try:
            check_layout(config.n_routed_experts, n, args.redundant_experts)
        except ValueError as e:
            return f"--ep {n} --redundant-experts {args.redundant_experts}: {e}"
    return None


def rank_configs(n_workers: int, size: int, args: argparse.Namespace) -> list[EPConfig | None]:
    """The EPConfig of each of a role's n_workers * size rank processes (None for each worker
    when size is 1), one fresh rendezvous per group."""
    if size == 1:
        return [None] * n_workers
    out: list[EPConfig | None] = []
    for group in range(n_workers):
        addr = free_tcp()
        out += [
            EPConfig(
                size=size,
                rank=r,
                group=group,
                init_addr=addr,
                redundant=args.redundant_experts,
                rebalance_interval=args.rebalance_interval,
            )
            for r in range(size)
        ]
    return out


def check_group_devices(role: str, devices: list[str], size: int) -> None:
    """ValueError when two ranks of one group share a CUDA device (NCCL, which the group uses
    on CUDA, refuses one device twice in a communicator) or mix CUDA and CPU ranks.
    devices: the role's workers' devices as the memory plan names them
    (core.memory_plan.device_name)."""
    for g in range(0, len(devices), size) if size > 1 else ():
        ranks = devices[g : g + size]
        cuda = [d for d in ranks if d.startswith("cuda")]
        if cuda and len(cuda) < len(ranks):
            raise ValueError(
                f"the ranks of {role} group {g // size} mix CUDA and CPU devices "
                f"({', '.join(ranks)}): a group talks over NCCL or gloo, not both"
            )
        if len(set(cuda)) < len(cuda):
            raise ValueError(
                f"the ranks of {role} group {g // size} share a CUDA device ({', '.join(ranks)}): "
                "give each rank its own (--devices cuda:0,cuda:1,...)"
            )
