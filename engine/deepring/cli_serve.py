"""`deepring serve | frontend | prefill | decode | bench`: the serving subcommands.

`serve` runs everything on this machine: the frontend in this process, prefill and decode
workers as spawned child processes, linked by ipc:// rings in a fresh directory (or tcp://
on free local ports). `frontend`, `prefill` and `decode` run one role each with explicit
tcp:// endpoints, so the roles can live on different hosts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from deepring import cli_ep, cli_sched, cli_security, cli_serve_args, env
from deepring.config import (
    EngineSpec,
    FrontendConfig,
    ServeConfig,
    WorkerConfig,
    check_address,
    free_tcp,
)
from deepring.model.embedded import EMBEDDED, is_embedded


def _kv_cache_dir(args: argparse.Namespace) -> str | None:
    if args.kv_cache_dir is None:
        return str(env.cache_dir() / "kv")
    return None if args.kv_cache_dir.lower() == "none" else args.kv_cache_dir


def _engine_spec(
    args: argparse.Namespace, max_num_seqs: int | None = None, budget: int | None = None
) -> EngineSpec:
    return EngineSpec(
        model=args.model,
        zero_cost=args.zero_cost,
        zero_cost_step_ms=args.zero_cost_step_ms,
        device=args.device,
        dtype=args.dtype,
        load_format=args.load_format,
        quantised=args.quantised,
        max_model_len=args.max_model_len,
        max_num_seqs=max_num_seqs or args.max_num_seqs,
        max_num_batched_tokens=budget or args.max_num_batched_tokens,
        num_blocks=args.num_blocks,
        cpu_threads=args.cpu_threads or env.cpu_threads() or 1,
        kv_cache_memory=args.kv_cache_memory,
        kv_cache_fraction=args.kv_cache_fraction,
        prefix_cache=not args.no_prefix_cache,
        kv_cache_dir=_kv_cache_dir(args),
        kv_store=args.kv_store,
        kv_host_memory=args.kv_host_memory,
        swa_replay=args.swa_replay,
        swa_ttl_s=args.swa_ttl,
        chat_ttl_s=args.chat_ttl,
        agent_ttl_s=args.agent_ttl,
        speculative=args.speculative,
        **cli_sched.pacing_settings(args),
    )


def _served_names(args: argparse.Namespace) -> tuple[str, ...]:
    if args.served_model_name:
        return tuple(args.served_model_name)
    return (args.model,) if is_embedded(args.model) else (Path(args.model).name,)


def _frontend_config(
    args: argparse.Namespace, ring: str, n_prefill: int, n_decode: int, security: dict
):
    """security: the ring_keys / insecure_ring fields (cli_security.ring_settings)."""
    return FrontendConfig(
        ring_addr=ring,
        host=args.host,
        port=args.port,
        served_model_names=_served_names(args),
        tokenizer=args.tokenizer,
        default_thinking=None if args.default_thinking is None else args.default_thinking == "on",
        default_max_tokens=args.default_max_tokens,
        expect_prefill=n_prefill,
        expect_decode=n_decode,
        router=args.router,
        tbt_target_ms=args.tbt_target,
        max_queued_requests=args.max_queued_requests,
        max_reroutes=args.max_reroutes,
        reroute_deadline=args.reroute_deadline,
        max_body_bytes=args.max_body_bytes,
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keepalive_timeout=args.keepalive_timeout,
        write_timeout=args.write_timeout,
        allowed_origins=cli_serve_args.origins(args.allowed_origins),
        drain_timeout=args.drain_timeout if args.drain_timeout is not None else env.drain_timeout(),
        heartbeat_interval=env.heartbeat_interval(),
        heartbeat_timeout=env.heartbeat_timeout(),
        queue_timeout=args.queue_timeout,
        **security,
        **cli_security.api_key_settings(args),
        **cli_security.image_url_settings(args),
    )


def _model_error(args: argparse.Namespace, needs_tokenizer: bool) -> str | None:
    """What is wrong with --model (and the tokenizer it brings, and the drafter
    --speculative needs), before anything starts."""
    problem = _path_error(args, needs_tokenizer)
    if problem is not None or args.speculative == "off":
        return problem
    from deepring.config import SpecMode
    from deepring.core.drafters import drafter_problem
    from deepring.model.config import ModelConfig
    from deepring.model.loader import resolve_model_path

    try:
        mode = SpecMode.parse(args.speculative)
        if not mode.on:
            return None
        if args.zero_cost:
            return "--speculative needs a model: it cannot run with --zero-cost"
        config = ModelConfig.from_pretrained(resolve_model_path(args.model))
    except ValueError as e:
        return str(e)
    return drafter_problem(mode, config, args.model)


def _path_error(args: argparse.Namespace, needs_tokenizer: bool) -> str | None:
    if is_embedded(args.model):
        return None
    from deepring.model.config import ModelConfig

    p = Path(args.model).expanduser()
    if not p.is_dir():
        names = ", ".join(EMBEDDED)
        return (
            f"--model {args.model!r} is neither an embedded model ({names}) nor a checkpoint "
            "directory"
        )
    try:
        ModelConfig.from_pretrained(p)
    except ValueError as e:
        return f"--model {args.model!r}: {e}"
    if needs_tokenizer and args.tokenizer is None and not (p / "tokenizer.json").is_file():
        return f"--model {args.model!r} has no tokenizer.json: pass --tokenizer FILE"
    return None


_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def worker_devices(devices: str | None, device: str | None, n: int) -> list[str | None]:
    """The device of each of `n` workers (prefill first, then decode): `--devices` round
    robin, else `--device` for all (None: cuda when available). ValueError for a malformed
    list, one combined with --device, or a CUDA index this machine does not have."""
    if devices is None:
        return [device] * n
    if device is not None:
        raise ValueError("--devices and --device exclude each other")
    listed = [d.strip() for d in devices.split(",")]
    bad = [d for d in listed if not _DEVICE.fullmatch(d)]
    if bad:
        raise ValueError(f"--devices: {bad[0]!r} is not cpu, cuda or cuda:N")
    indices = [int(d.split(":")[1]) if ":" in d else 0 for d in listed if d.startswith("cuda")]
    if indices:
        import torch

        have = torch.cuda.device_count()
        if max(indices) >= have:
            raise ValueError(
                f"--devices: cuda:{max(indices)} asked for, this machine has {have} CUDA devices"
            )
    return [listed[i % len(listed)] for i in range(n)]


def _on(spec: EngineSpec, device: str | None) -> EngineSpec:
    return spec if device == spec.device else dataclasses.replace(spec, device=device)


def _serve(args: argparse.Namespace) -> int:
    if args.num_prefill < 1 or args.num_decode < 1:
        print("deepring serve: need at least one prefill and one decode worker", file=sys.stderr)
        return 2
    problem = _model_error(args, needs_tokenizer=True) or cli_ep.ep_problem(args)
    if problem is not None:
        print(f"deepring serve: {problem}", file=sys.stderr)
        return 2
    ipc_dir = None
    if args.transport == "ipc":
        base = env.ipc_dir()
        base.mkdir(parents=True, exist_ok=True)
        ipc_dir = tempfile.mkdtemp(prefix="deepring-", dir=base)

        def addr(name: str) -> str:
            return f"ipc://{ipc_dir}/{name}"
    else:

        def addr(name: str) -> str:
            return free_tcp()

    try:
        try:
            decode_spec = _engine_spec(args)
            prefill_spec = _engine_spec(
                args, args.prefill_max_num_seqs, args.prefill_max_num_batched_tokens
            )
            ring = addr("ring")
            security = cli_security.ring_settings(args, [ring], "serve", create=True)
            # Every rank of an expert-parallel group is a worker to the frontend (cli_ep).
            size = cli_ep.ranks_per_worker(args)
            n_prefill = args.num_prefill * size["prefill"]
            n_decode = args.num_decode * size["decode"]
            fe = _frontend_config(args, ring, n_prefill, n_decode, security)
            common = {
                "frontend_addrs": (fe.ring_addr,),
                "parent_pid": os.getpid(),
                "heartbeat_interval": fe.heartbeat_interval,
                "heartbeat_timeout": fe.heartbeat_timeout,
                "trace_dir": args.trace_dir,
                "overlap": not args.no_overlap,
                **security,
            }
            devices = worker_devices(args.devices, args.device, n_prefill + n_decode)
            from deepring.core.memory_plan import device_name

            named = [device_name(d) for d in devices]
            cli_ep.check_group_devices("prefill", named[:n_prefill], size["prefill"])
            cli_ep.check_group_devices("decode", named[n_prefill:], size["decode"])
            prefill_ep = cli_ep.rank_configs(args.num_prefill, size["prefill"], args)
            decode_ep = cli_ep.rank_configs(args.num_decode, size["decode"], args)
            workers = [
                WorkerConfig(
                    role="prefill",
                    index=i,
                    engine=_on(prefill_spec, devices[i]),
                    ep=prefill_ep[i],
                    **common,
                )
                for i in range(n_prefill)
            ]
            for i in range(n_decode):
                h = addr(f"handoff-{i}")
                spec = _on(decode_spec, devices[n_prefill + i])
                workers.append(
                    WorkerConfig(
                        role="decode",
                        index=i,
                        engine=spec,
                        handoff_bind=h,
                        ep=decode_ep[i],
                        **common,
                    )
                )
            cfg = ServeConfig(
                frontend=fe, workers=tuple(workers), reserve_workers=args.reserve_workers
            )
            from deepring.core import memory_plan

            # Said (and checked) before any worker loads: a model that cannot fit fails here,
            # in one line, not as an out-of-memory in a worker's log.
            rows = memory_plan.plan(cfg.workers)
            print(memory_plan.describe(rows, memory_plan.check_fits(rows, args.max_memory)))
        except ValueError as e:
            print(f"deepring serve: {e}", file=sys.stderr)
            return 2
        from deepring import launcher

        return launcher.run(cfg)
    finally:
        if ipc_dir is not None:
            shutil.rmtree(ipc_dir, ignore_errors=True)


def _frontend(args: argparse.Namespace) -> int:
    from deepring.frontend import server
    from deepring.logs import setup_logging

    try:
        security = cli_security.ring_settings(args, [args.ring], "frontend", create=True)
        fe = _frontend_config(args, args.ring, args.num_prefill, args.num_decode, security)
    except ValueError as e:
        print(f"deepring frontend: {e}", file=sys.stderr)
        return 2
    setup_logging("frontend")
    return server.run(fe)


def _worker(args: argparse.Namespace) -> int:
    from deepring.worker.process import run_worker

    problem = _model_error(args, needs_tokenizer=False)
    if problem is not None:
        print(f"deepring {args.command}: {problem}", file=sys.stderr)
        return 2
    try:
        handoff_bind = getattr(args, "handoff_bind", None)
        # Endpoints first: a typo is reported as such, not as missing ring keys.
        frontends = tuple(a.strip() for arg in args.frontend for a in arg.split(","))
        for addr in frontends:
            check_address("--frontend", addr)
        if handoff_bind is not None:
            check_address("--handoff-bind", handoff_bind)
        cfg = WorkerConfig(
            role=args.command,
            index=args.index,
            frontend_addrs=frontends,
            engine=_engine_spec(args),
            handoff_bind=handoff_bind,
            handoff_addr=getattr(args, "handoff_addr", None),
            heartbeat_interval=env.heartbeat_interval(),
            heartbeat_timeout=env.heartbeat_timeout(),
            trace_dir=args.trace_dir,
            overlap=not args.no_overlap,
            **cli_security.ring_settings(
                args, [*frontends, handoff_bind], args.command, create=False
            ),
        )
    except ValueError as e:
        print(f"deepring {args.command}: {e}", file=sys.stderr)
        return 2
    return run_worker(cfg)


def add_serving_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="frontend + prefill + decode on this machine")
    cli_serve_args.add_frontend_args(p)
    cli_serve_args.add_engine_args(p)
    g = p.add_argument_group("processes")
    g.add_argument("--num-prefill", type=int, default=1, help="prefill worker processes")
    g.add_argument("--num-decode", type=int, default=1, help="decode worker processes")
    g.add_argument(
        "--devices",
        default=None,
        metavar="LIST",
        help="one device per worker (per rank with --ep), comma-separated (cpu, cuda, cuda:N), "
        "in the order prefill-0.., decode-0..; a shorter list is reused from its start "
        "(instead of --device)",
    )
    g.add_argument(
        "--reserve-workers",
        type=int,
        default=0,
        metavar="K",
        help="warm spares (model loaded) that take over a failed worker's role at once",
    )
    g.add_argument(
        "--prefill-max-num-seqs",
        type=int,
        default=32,
        help="requests a prefill worker prefills at once",
    )
    g.add_argument(
        "--prefill-max-num-batched-tokens",
        type=int,
        default=512,
        help="token budget of a prefill step (default 512: small steps let first tokens, and "
        "with them the decode worker, start sooner while a burst of prompts is prefilled; "
        "raise it on GPUs, where bigger prefill steps are cheaper per token)",
    )
    g.add_argument(
        "--transport",
        choices=["ipc", "tcp"],
        default="ipc",
        help="ipc:// sockets in a fresh directory under DEEPRING_IPC_DIR, or local tcp:// ports "
        "(CURVE-secured)",
    )
    g.add_argument(
        "--max-memory",
        type=cli_serve_args.size,
        default=None,
        metavar="SIZE",
        help="bytes each device may hold for its workers; the memory plan printed at start "
        "must fit (default: a CUDA device's memory, the host's available memory for cpu)",
    )
    cli_ep.add_ep_args(p)
    cli_security.add_ring_args(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser("frontend", help="the HTTP frontend alone (workers connect to --ring)")
    p.add_argument("--ring", required=True, help="endpoint to bind for workers, e.g. tcp://*:5555")
    p.add_argument("--num-prefill", type=int, default=1, help="prefill workers to wait for")
    p.add_argument("--num-decode", type=int, default=1, help="decode workers to wait for")
    p.add_argument("--model", default="tiny", help="only names the served model")
    cli_serve_args.add_frontend_args(p, frontend_only=True)
    cli_security.add_ring_args(p)
    p.set_defaults(func=_frontend)

    for role, text in (("prefill", "one prefill worker"), ("decode", "one decode worker")):
        p = sub.add_parser(role, help=text)
        p.add_argument(
            "--frontend",
            required=True,
            action="append",
            metavar="ENDPOINT",
            help="a frontend's --ring endpoint; repeat it (or separate endpoints with commas) "
            "to serve several frontends, which then share this worker",
        )
        p.add_argument("--index", type=int, default=0, help="worker number within its role")
        if role == "decode":
            p.add_argument(
                "--handoff-bind",
                required=True,
                help="endpoint to bind for handoffs, e.g. tcp://*:5601",
            )
            p.add_argument(
                "--handoff-addr",
                default=None,
                help="that endpoint as prefill hosts reach it (default: as bound)",
            )
        cli_serve_args.add_engine_args(p, max_num_seqs=64 if role == "decode" else 32)
        cli_security.add_ring_args(p)
        p.set_defaults(func=_worker)


def add_bench_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="streaming load against a running server")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="tiny")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated client counts")
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt words (random)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from deepring import loadgen

    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        print(
            f"--concurrency takes comma-separated integers, got {args.concurrency!r}",
            file=sys.stderr,
        )
        return 2
    rows = []
    for c in levels:
        rows.append(
            loadgen.run(
                args.url, args.model, c, args.requests, args.prompt_len, args.max_tokens, args.seed
            )
        )
    print(loadgen.table(rows))
    return 0
