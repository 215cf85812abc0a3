"""Configuration of the serving processes, one frozen dataclass per role.

Every address and port comes from here (filled from the command line or chosen freely by
`deepring serve`); nothing in the serving code hard-codes an endpoint. Environment variables
are read in env.py only.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field

ROLES = ("prefill", "decode")
# The prefix cache's TTL classes (EngineSpec.chat_ttl_s / agent_ttl_s).
CACHE_CLASSES = ("chat", "agent")
# Store TTLs by traffic class (DeepSeek's figures: agent traffic 3 days, chatbot traffic 7 days)
# and of ring snapshots (minutes: the SWA pool).
CHAT_TTL_S = 7 * 86400.0
AGENT_TTL_S = 3 * 86400.0
SWA_TTL_S = 180.0
SWA_REPLAY = ("exact", "bounded")
# How the frontend picks workers: routing.router (queued tokens, free slots and blocks) or
# routing.balance (the workers' step-time models and load reports).
ROUTERS = ("tokens", "cost")
_ADDR_SCHEMES = ("ipc://", "tcp://", "inproc://")


def check_address(name: str, addr: str) -> None:
    if not isinstance(addr, str) or not addr.startswith(_ADDR_SCHEMES):
        raise ValueError(f"{name} must be a ZeroMQ endpoint (ipc://, tcp://), got {addr!r}")


def free_tcp(host: str = "127.0.0.1") -> str:
    """A tcp:// endpoint on a port free now (the OS picks it; another process could take it
    before it is bound, which a local `deepring serve` accepts)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def _check_ring_security(addrs: dict[str, str | None], keys: str | None, insecure: bool) -> None:
    """tcp:// ring endpoints are CURVE-secured (ipc.curve): they need a key directory, or an
    explicit insecure_ring."""
    tcp = [name for name, a in addrs.items() if a is not None and a.startswith("tcp://")]
    if tcp and keys is None and not insecure:
        raise ValueError(
            f"{tcp[0]} is a tcp:// endpoint: the ring needs CURVE keys (--ring-keys DIR) or "
            "--insecure-ring"
        )


# An API key: printable ASCII without spaces (it travels in an HTTP header), 8 to 256 chars.
_API_KEY = re.compile(r"[\x21-\x7e]{8,256}")


def check_api_key(key: str, where: str = "an API key") -> None:
    """ValueError (which never quotes the key) unless `key` can be an API key."""
    if not isinstance(key, str) or _API_KEY.fullmatch(key) is None:
        raise ValueError(f"{where} must be 8 to 256 printable ASCII characters without spaces")


_RATE_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}


@dataclass(frozen=True)
class RateLimit:
    """`amount` per `per_s` seconds, written `60/min`, `5/s`, `1000/h` (a token bucket of
    `amount` that refills at amount / per_s each second)."""

    amount: float
    per_s: float

    def __post_init__(self) -> None:
        if not (self.amount > 0 and self.per_s > 0):
            raise ValueError("a rate limit needs a positive amount and period")

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        amount, _, unit = text.strip().partition("/")
        try:
            value = float(amount)
        except ValueError:
            value = float("nan")
        if unit.strip().lower() not in _RATE_UNITS or not value > 0 or value == float("inf"):
            raise ValueError(f"a rate is N/s, N/min or N/h with N > 0 (e.g. 60/min), got {text!r}")
        return cls(value, _RATE_UNITS[unit.strip().lower()])

    @property
    def per_second(self) -> float:
        return self.amount / self.per_s

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "min", 3600.0: "h"}.get(self.per_s, f"{self.per_s:g}s")
        return f"{self.amount:g}/{unit}"


SPECULATIVE = ("off", "mtp", "fixed:N", "dspark")


@dataclass(frozen=True)
class SpecMode:
    """`--speculative`: off | mtp (the MTP layer, 1 token) | fixed:N (the DSpark drafter, N
    tokens every step) | dspark (the DSpark drafter, lengths scheduled from its confidence)."""

    kind: str = "off"
    length: int = 0  # drafts per step (dspark: 0, the drafter's block decides)

    @classmethod
    def parse(cls, text: str) -> SpecMode:
        t = text.strip().lower()
        if t in ("off", "mtp", "dspark"):
            return cls(t, {"off": 0, "mtp": 1, "dspark": 0}[t])
        if t.startswith("fixed:"):
            n = t.removeprefix("fixed:")
            if not n.isdigit() or not 1 <= int(n) <= 64:
                raise ValueError(f"--speculative fixed:N needs N in 1..64, got {text!r}")
            return cls("fixed", int(n))
        raise ValueError(f"--speculative must be one of {', '.join(SPECULATIVE)}, got {text!r}")

    @property
    def on(self) -> bool:
        return self.kind != "off"

    def __str__(self) -> str:
        return f"fixed:{self.length}" if self.kind == "fixed" else self.kind


@dataclass(frozen=True)
class EngineSpec:
    """What a worker serves and how big its caches are."""

    model: str = "tiny"
    zero_cost: bool = False  # tokens without compute: measures the serving stack alone
    # Zero-cost mode: wall time each step pretends to take (0: none). A paced step rules out
    # the frontend batching many tokens per event, so the per-event cost gets measured.
    zero_cost_step_ms: float = 0.0
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str | None = None
    load_format: str = "auto"
    # A checkpoint's FP8 / MXFP4 weights: auto (kept quantised on CUDA, dequantised on CPU),
    # keep or dequantise (model.loader.keeps_quantised).
    quantised: str = "auto"
    seed: int = 0
    max_model_len: int = 4096
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # Chunk sizes from a latency target (cost.pacer): a step carrying decode tokens takes the
    # largest prefill chunk that keeps its predicted time under tbt_target_ms (None: the token
    # budget alone); ttft_target_ms lets a prompt exceed that to make its first-token deadline.
    tbt_target_ms: float | None = None
    ttft_target_ms: float | None = None
    min_chunk_tokens: int = 16  # a mixed step's prefill still gets this many when over target
    num_blocks: int | None = None  # None: room for max_num_seqs requests of max_model_len
    block_size: int = 128
    cpu_threads: int | None = 1  # torch intra-op threads on CPU (roles share the cores)
    # Bytes of the paged cache (None: num_blocks). Sizes the pool by memory, not by requests.
    kv_cache_memory: int | None = None
    # Or a fraction of the device memory free once the model is loaded (CUDA: the device's
    # free memory; CPU: the host's available memory).
    kv_cache_fraction: float | None = None
    # Prefix KV cache (core.prefix). kv_cache_dir: the directory store (None: none; `deepring
    # serve` defaults it under the cache directory); kv_store: a shared Redis tier.
    prefix_cache: bool = True
    kv_cache_dir: str | None = None
    kv_store: str | None = None
    kv_host_memory: int = 1 << 30  # host tier of block records
    swa_replay: str = "exact"  # exact | bounded
    swa_ttl_s: float = SWA_TTL_S  # ring snapshots (host pool and store)
    chat_ttl_s: float = CHAT_TTL_S
    agent_ttl_s: float = AGENT_TTL_S
    # Speculative decoding (core.speculative): off | mtp | fixed:N | dspark.
    speculative: str = "off"

    def __post_init__(self) -> None:
        SpecMode.parse(self.speculative)  # ValueError naming the choices
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.num_blocks is not None and self.num_blocks < self.blocks_per_seq + 1:
            raise ValueError(
                f"num_blocks ({self.num_blocks}) must hold one request of max_model_len "
                f"({self.blocks_per_seq} blocks) plus the reserved block"
            )
        if not self.zero_cost_step_ms >= 0:
            raise ValueError("zero_cost_step_ms must be >= 0")
        for name in ("tbt_target_ms", "ttft_target_ms"):
            value = getattr(self, name)
            if value is not None and not 0 < value < 1e7:
                raise ValueError(f"{name} must be > 0")
        if self.ttft_target_ms is not None and self.tbt_target_ms is None:
            raise ValueError("a TTFT target paces mixed steps: it needs a TBT target too")
        if self.min_chunk_tokens < 1:
            raise ValueError("min_chunk_tokens must be >= 1")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError("cpu_threads must be >= 1")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError("kv_cache_memory must be >= 1 byte")
        if self.kv_cache_fraction is not None:
            if not 0 < self.kv_cache_fraction <= 0.95:
                raise ValueError("kv_cache_fraction must be in (0, 0.95]")
            if self.kv_cache_memory is not None:
                raise ValueError("give kv_cache_memory or kv_cache_fraction, not both")
        if self.swa_replay not in SWA_REPLAY:
            raise ValueError(f"swa_replay must be one of {SWA_REPLAY}, got {self.swa_replay!r}")
        if self.kv_host_memory < 0:
            raise ValueError("kv_host_memory must be >= 0")
        for name in ("swa_ttl_s", "chat_ttl_s", "agent_ttl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")

    def ttl_s(self, cache_class: str) -> float:
        """The store TTL of a request's blocks by its class."""
        if cache_class not in CACHE_CLASSES:
            raise ValueError(f"cache class must be one of {CACHE_CLASSES}, got {cache_class!r}")
        return self.agent_ttl_s if cache_class == "agent" else self.chat_ttl_s

    def pacing(self):
        """The chunk pacer's settings (cost.pacer.PacerConfig), None without a TBT target."""
        if self.tbt_target_ms is None:
            return None
        from deepring.cost.pacer import PacerConfig

        ttft = self.ttft_target_ms
        return PacerConfig(
            tbt_target_s=self.tbt_target_ms / 1000,
            ttft_target_s=ttft / 1000 if ttft is not None else None,
            min_chunk=self.min_chunk_tokens,
        )

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def total_blocks(self) -> int:
        return self.num_blocks or self.max_num_seqs * self.blocks_per_seq + 1


@dataclass(frozen=True)
class EPConfig:
    """This worker as one rank of an expert-parallel group (`deepring serve --ep N`): the
    group's N ranks are N workers of one role (each registered with the frontend, each with its
    own requests and caches: attention is data parallel) whose MoE layers share the routed
    experts over torch.distributed (ep.group)."""

    size: int  # ranks in the group
    rank: int
    group: int  # the group's number within its role
    # torch.distributed rendezvous (tcp://host:port; rank 0 serves it). `deepring serve` picks
    # a fresh port each time it starts the group, so a restarted group never meets the old one.
    init_addr: str
    redundant: int = 0  # spare expert slots over the group (ep.placement)
    rebalance_interval: int = 0  # group steps between rearrangements of the experts (0: never)

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError("an expert-parallel group needs at least 2 ranks")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} outside a group of {self.size}")
        if self.group < 0 or self.redundant < 0 or self.rebalance_interval < 0:
            raise ValueError("group, redundant experts and rebalance interval must be >= 0")
        if not self.init_addr.startswith("tcp://"):
            raise ValueError(f"the rendezvous must be tcp://host:port, got {self.init_addr!r}")


@dataclass(frozen=True)
class WorkerConfig:
    """One prefill or decode process."""

    role: str
    index: int
    # The ring endpoints of the frontends this worker serves (it connects to each; several
    # frontends share one pool of workers, docs/deployment.md).
    frontend_addrs: tuple[str, ...]
    engine: EngineSpec
    handoff_bind: str | None = None  # decode: where prefill workers deliver handoffs
    handoff_addr: str | None = None  # decode: that endpoint as prefill workers reach it
    parent_pid: int | None = None  # supervised: exit when this process goes away
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    stats_interval: float = 0.25  # load reports while busy (the router reads them)
    ring_keys: str | None = None  # CURVE key directory for tcp:// endpoints (ipc.ring_keys)
    insecure_ring: bool = False  # tcp:// without CURVE (a trusted network only)
    trace_dir: str | None = None  # the step timeline goes to <trace_dir>/<worker id>.trace.json
    # The step runs on its own thread while the loop sends the previous step's outputs and
    # takes the ring's messages (worker.process); False: one thread, in sequence.
    overlap: bool = True
    ep: EPConfig | None = None  # a rank of an expert-parallel group (None: a whole worker)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.index < 0:
            raise ValueError("worker index must be >= 0")
        addrs = tuple(self.frontend_addrs)
        if not addrs:
            raise ValueError("a worker needs at least one frontend endpoint")
        if len(set(addrs)) != len(addrs):
            raise ValueError(f"a frontend endpoint is listed twice: {list(addrs)}")
        for addr in addrs:
            check_address("a frontend endpoint", addr)
        object.__setattr__(self, "frontend_addrs", addrs)
        if self.role == "decode":
            if self.handoff_bind is None:
                raise ValueError("a decode worker needs a handoff endpoint to bind")
            check_address("handoff_bind", self.handoff_bind)
            check_address("handoff_addr", self.handoff_addr or self.handoff_bind)
        if not 0 < self.heartbeat_interval < self.heartbeat_timeout:
            raise ValueError("need 0 < heartbeat_interval < heartbeat_timeout")
        _check_ring_security(
            {
                **{f"the frontend endpoint {a}": a for a in self.frontend_addrs},
                "the handoff endpoint": self.handoff_bind,
            },
            self.ring_keys,
            self.insecure_ring,
        )

    @property
    def worker_id(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def advertised_handoff(self) -> str | None:
        return self.handoff_addr or self.handoff_bind


@dataclass(frozen=True)
class FrontendConfig:
    """The HTTP frontend and the ring endpoint the workers connect to."""

    ring_addr: str  # bound by the frontend
    host: str = "127.0.0.1"
    port: int = 8000
    # The model names requests may use; the first is the one /v1/models and /health report.
    served_model_names: tuple[str, ...] = ("tiny",)
    tokenizer: str | None = None  # tokenizer.json; None: the path the first worker reports
    # Thinking mode for requests that do not say: None is off for a model with random weights
    # (which never closes its reasoning) and on otherwise (the official default).
    default_thinking: bool | None = None
    # Output cap for requests that set no max_tokens: None is 256 for a model with random
    # weights (which never ends an answer) and the protocol's default otherwise.
    default_max_tokens: int | None = None
    # Worker choice (ROUTERS): "cost" (routing.balance) or "tokens" (routing.router).
    router: str = "cost"
    # The decode workers' TBT target, if they have one: the cost router measures a decode
    # worker's predicted step time against it.
    tbt_target_ms: float | None = None
    expect_prefill: int = 1  # ready only when this many prefill workers are registered
    expect_decode: int = 1
    max_queued_requests: int = 256  # requests waiting beyond the decode slots; then 429
    # A request whose worker dies is resubmitted (with its tokens so far); it fails after this
    # many reroutes in a row without a new token, or once it is older than the deadline.
    max_reroutes: int = 3
    reroute_deadline: float = 600.0
    max_body_bytes: int = 8 << 20  # larger request bodies get 413
    drain_timeout: float = 30.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    keepalive_timeout: float = 75.0  # idle HTTP connections are closed after this
    # A request waiting for a worker (none registered, or none with room) fails with 503 after
    # this many seconds.
    queue_timeout: float = 60.0
    ring_keys: str | None = None  # CURVE key directory for a tcp:// ring (ipc.ring_keys)
    insecure_ring: bool = False  # a tcp:// ring without CURVE (a trusted network only)
    # API keys (frontend.auth): with any configured, every route but /health needs one. Never
    # in the repr, so a logged config shows no key.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    api_keys_file: str | None = None  # one key per line, `#` comments; re-read on SIGHUP
    rate_limit_requests: RateLimit | None = None  # per API key
    rate_limit_tokens: RateLimit | None = None  # prompt + generated tokens per API key
    header_timeout: float = 10.0  # a request head must arrive within this of its first byte
    body_timeout: float = 30.0  # a request body may pause this long between bytes; then 408
    write_timeout: float = 60.0  # a client that reads nothing for this long is dropped
    # Open HTTP connections; more are answered 503. None: 1024, or less where the open-file
    # limit (RLIMIT_NOFILE) leaves less room.
    max_connections: int | None = None
    # Origins (scheme://host[:port]) allowed to differ from the Host they are sent to; "*" is
    # any. A request whose Origin names another host than its Host is refused (403) otherwise.
    allowed_origins: tuple[str, ...] = ()
    # Hosts request images may be fetched from (protocol.images.UrlPolicy); none: image URLs
    # are refused. Private addresses only with image_url_allow_private.
    image_url_hosts: tuple[str, ...] = ()
    image_url_allow_private: bool = False

    def __post_init__(self) -> None:
        check_address("ring_addr", self.ring_addr)
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.expect_prefill < 1 or self.expect_decode < 1:
            raise ValueError("need at least one prefill and one decode worker")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.tbt_target_ms is not None and not 0 < self.tbt_target_ms < 1e7:
            raise ValueError("tbt_target_ms must be > 0")
        if self.max_queued_requests < 0:
            raise ValueError("max_queued_requests must be >= 0")
        if self.max_reroutes < 0 or not self.reroute_deadline > 0:
            raise ValueError("max_reroutes must be >= 0 and reroute_deadline > 0")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        if not self.served_model_names or not all(self.served_model_names):
            raise ValueError("served model names must not be empty")
        if len(set(self.served_model_names)) != len(self.served_model_names):
            raise ValueError(f"duplicate served model names: {list(self.served_model_names)}")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if self.drain_timeout < 0:
            raise ValueError("drain_timeout must be >= 0")
        if not 0 < self.heartbeat_interval < self.heartbeat_timeout:
            raise ValueError("need 0 < heartbeat_interval < heartbeat_timeout")
        if not self.queue_timeout > 0:
            raise ValueError("queue_timeout must be > 0")
        _check_ring_security(
            {"the ring endpoint": self.ring_addr}, self.ring_keys, self.insecure_ring
        )
        for key in self.api_keys:
            check_api_key(key)
        limited = self.rate_limit_requests or self.rate_limit_tokens
        if limited and not (self.api_keys or self.api_keys_file):
            raise ValueError("rate limits are per API key: configure --api-key or --api-keys-file")
        for name in ("header_timeout", "body_timeout", "write_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.keepalive_timeout < 0:
            raise ValueError("keepalive_timeout must be >= 0")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        for origin in self.allowed_origins:
            if origin != "*" and not origin.startswith(("http://", "https://")):
                raise ValueError(
                    f"an allowed origin is '*' or scheme://host[:port], got {origin!r}"
                )

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys or self.api_keys_file)

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]


@dataclass(frozen=True)
class ServeConfig:
    """`deepring serve`: a frontend and the local worker processes it supervises."""

    frontend: FrontendConfig
    workers: tuple[WorkerConfig, ...]
    reserve_workers: int = 0  # warm spares that take over a failed worker's role (spares.py)

    def __post_init__(self) -> None:
        if self.reserve_workers < 0:
            raise ValueError("reserve_workers must be >= 0")
        ids = [w.worker_id for w in self.workers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate worker ids: {ids}")
        for role, want in (
            ("prefill", self.frontend.expect_prefill),
            ("decode", self.frontend.expect_decode),
        ):
            have = sum(w.role == role for w in self.workers)
            if have != want:
                raise ValueError(f"{have} {role} workers configured, frontend expects {want}")
