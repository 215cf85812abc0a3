"""The arguments of the serving subcommands (cli_serve): the engine's, the prefix cache's and the
HTTP frontend's flags, and the value parsers they use (sizes, origin lists)."""

from __future__ import annotations

import argparse

from deepring import cli_sched, cli_security
from deepring.config import EngineSpec, FrontendConfig


def add_quantised_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--quantised, for every command that loads a model (generate and the serving ones)."""
    p.add_argument(
        "--quantised",
        default="auto",
        choices=["auto", "keep", "dequantise"],
        help="a checkpoint's FP8 / MXFP4 weights: kept quantised in memory (the Triton GEMMs) "
        "or dequantised at load (default auto: kept on CUDA, dequantised on CPU)",
    )


def add_engine_args(p: argparse.ArgumentParser, max_num_seqs: int = 64) -> None:
    g = p.add_argument_group("model and caches")
    g.add_argument(
        "--model",
        default="tiny",
        help="model path or an embedded model: 'tiny' (the default, random weights), "
        "'tiny-trained' (trained on the Python standard library) or 'v41-tiny' (a DeepSeek "
        "V4.1, random weights)",
    )
    g.add_argument(
        "--zero-cost",
        action="store_true",
        help="tokens without compute: measure the serving stack alone",
    )
    g.add_argument(
        "--speculative",
        default="off",
        metavar="MODE",
        help="speculative decoding: off (default), mtp (the MTP layer, 1 draft), fixed:N (the "
        "DSpark drafter, N drafts), dspark (DSpark, lengths scheduled from its confidence)",
    )
    g.add_argument(
        "--zero-cost-step-ms",
        type=float,
        default=0.0,
        help="zero-cost mode: wall time each engine step takes (default 0)",
    )
    g.add_argument("--device", default=None, help="cpu | cuda[:N] (default: cuda when available)")
    g.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: auto)")
    g.add_argument(
        "--no-overlap",
        action="store_true",
        help="run each worker's steps on its loop thread, in sequence with the ring's I/O "
        "(default: the step on its own thread, overlapped with sending and receiving)",
    )
    g.add_argument(
        "--trace-dir",
        default=None,
        metavar="DIR",
        help="each worker writes its step timeline to DIR/<worker>.trace.json (a Chrome trace: "
        "Perfetto, chrome://tracing)",
    )
    g.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    add_quantised_arg(g)
    g.add_argument("--max-model-len", type=int, default=4096)
    g.add_argument(
        "--max-num-seqs", type=int, default=max_num_seqs, help="batch slots of a (decode) worker"
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=EngineSpec.max_num_batched_tokens,
        help="token budget of one engine step (chunked prefill)",
    )
    g.add_argument(
        "--num-blocks",
        type=int,
        default=None,
        help="KV blocks per worker (default: max-num-seqs full-length requests)",
    )
    g.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="torch threads per worker on CPU (default: DEEPRING_CPU_THREADS or 1)",
    )
    g.add_argument(
        "--kv-cache-memory",
        type=size,
        default=None,
        metavar="SIZE",
        help="bytes of paged KV cache per worker, e.g. 2GiB (overrides --num-blocks)",
    )
    g.add_argument(
        "--kv-cache-fraction",
        type=float,
        default=None,
        metavar="F",
        help="the paged KV cache takes this fraction (0-0.95] of the device memory free once "
        "the model is loaded (CUDA: the device's; CPU: the host's available memory)",
    )
    add_prefix_args(p)
    cli_sched.add_pacing_args(p)


def add_prefix_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prefix KV cache (docs/configuration.md)")
    g.add_argument(
        "--no-prefix-cache", action="store_true", help="recompute every prompt from scratch"
    )
    g.add_argument(
        "--kv-cache-dir",
        default=None,
        metavar="DIR",
        help="directory store of cached blocks, shareable over a POSIX mount "
        "(default: DEEPRING_CACHE_DIR/kv; 'none': no directory store)",
    )
    g.add_argument(
        "--kv-store", default=None, metavar="URL", help="a shared Redis tier, redis://host:port"
    )
    g.add_argument(
        "--kv-host-memory",
        type=size,
        default=EngineSpec.kv_host_memory,
        metavar="SIZE",
        help="host-memory tier of cached blocks per worker (default 1GiB)",
    )
    g.add_argument(
        "--swa-replay",
        choices=["exact", "bounded"],
        default="exact",
        help="a hit without its window ring: recompute the ring's receptive field (exact, "
        "as a cold run) or the last window only (bounded, V4.1's approximation)",
    )
    g.add_argument(
        "--swa-ttl", type=float, default=EngineSpec.swa_ttl_s, help="seconds a ring snapshot lives"
    )
    g.add_argument(
        "--chat-ttl", type=float, default=EngineSpec.chat_ttl_s, help="seconds (default 7 days)"
    )
    g.add_argument(
        "--agent-ttl",
        type=float,
        default=EngineSpec.agent_ttl_s,
        help="seconds for requests that declare tools (default 3 days)",
    )


_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6,
          "mib": 1 << 20, "g": 1e9, "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12,
          "tib": 1 << 40}  # fmt: skip


def size(text: str) -> int:
    """A byte count: 1073741824, 1GiB, 512MiB, 2G, 1.5GB."""
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num) :].strip()
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size must be >= 0, got {text!r}")
    return int(value)


def add_frontend_args(p: argparse.ArgumentParser, frontend_only: bool = False) -> None:
    g = p.add_argument_group("HTTP frontend")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    g.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the model names clients may send; others get 400 (default: 'tiny' or the model "
        "directory name)",
    )
    g.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="output cap of requests that set no max_tokens (default: 256 for a model with "
        "random weights, which never ends an answer; otherwise the protocol's own default)",
    )
    g.add_argument(
        "--default-thinking",
        choices=["on", "off"],
        default=None,
        help="thinking mode for requests that do not choose (default: off for a model with "
        "random weights such as 'tiny', which never ends its reasoning; on otherwise)",
    )
    g.add_argument(
        "--tokenizer", default=None, help="tokenizer.json (default: the one the workers report)"
    )
    g.add_argument(
        "--max-queued-requests",
        type=int,
        default=256,
        help="requests allowed to wait beyond the decode slots before 429",
    )
    g.add_argument(
        "--max-reroutes",
        type=int,
        default=FrontendConfig.max_reroutes,
        help="reroutes in a row without a new token before a request fails (default 3)",
    )
    g.add_argument(
        "--reroute-deadline",
        type=float,
        default=FrontendConfig.reroute_deadline,
        help="seconds after its arrival a request may still be rerouted (default 600)",
    )
    g.add_argument("--max-body-bytes", type=int, default=8 << 20)
    g.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="open HTTP connections; each one beyond is answered 503 with Retry-After and "
        "closed (default: 1024, or less where the open-file limit leaves less room)",
    )
    g.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a request head may take to arrive (from its first byte); then 408",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a request body may pause between two bytes; then 408",
    )
    g.add_argument(
        "--keepalive-timeout",
        type=float,
        default=75.0,
        metavar="S",
        help="seconds an idle keep-alive connection stays open (0: until the client closes it)",
    )
    g.add_argument(
        "--write-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a client may leave the server's send buffer full before it is dropped",
    )
    g.add_argument(
        "--allowed-origins",
        default="",
        metavar="ORIGINS",
        help="comma-separated origins (scheme://host[:port]) whose browser requests are "
        "served although they name another host than the request's Host; '*' allows any "
        "(default: none, so such requests get 403)",
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="seconds SIGTERM waits for in-flight requests (DEEPRING_DRAIN_TIMEOUT)",
    )
    g.add_argument(
        "--queue-timeout",
        type=float,
        default=FrontendConfig.queue_timeout,
        metavar="S",
        help="a request that waited this long for a worker (none available, or none with "
        "room) fails with 503 (default 60)",
    )
    cli_security.add_api_key_args(p)
    cli_security.add_image_url_args(p)
    cli_sched.add_router_args(p, tbt_target=frontend_only)


def origins(text: str) -> tuple[str, ...]:
    """--allowed-origins: a comma list; a trailing slash is dropped (an Origin has none)."""
    return tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())
