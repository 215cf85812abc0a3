"""HTTP routes of the frontend.

POST /v1/chat/completions, /v1/responses, /v1/messages  generation (SSE or JSON)
GET  /v1/models                                         the served model
GET  /health                                            200 when every worker is ready
GET  /metrics                                           Prometheus text format

With API keys configured every route but /health needs one (frontend.auth), and the
generation routes count against the key's rate limits (frontend.ratelimit).
GET routes also answer HEAD; a route answers another method with 405 and Allow, OPTIONS with
its Allow (and CORS preflights of allowed origins, see origins.py). Generation takes only
`Content-Type: application/json` (else 415): with the Origin rule, that keeps other sites'
pages from making browsers run requests here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from deepring.config import CACHE_CLASSES, FrontendConfig
from deepring.frontend.auth import Authenticator
from deepring.frontend.client import EngineClient
from deepring.frontend.http import HttpRequest
from deepring.frontend.metrics import Metrics
from deepring.frontend.origins import (
    cors_headers,
    normalize,
    origin_allowed,
    preflight_headers,
    same_host,
)
from deepring.frontend.ratelimit import RateLimiter
from deepring.frontend.requests import Overloaded
from deepring.frontend.stream import JsonSink, SseSink
from deepring.protocol import nested
from deepring.protocol.errors import ApiError, error_body
from deepring.protocol.formats import PromptFormat
from deepring.protocol.images import ImageSupport, UrlPolicy
from deepring.protocol.prepare import CHAT, MESSAGES, RESPONSES, Api, Prepared, Recipe

log = logging.getLogger("deepring.frontend")

# Bodies above this are converted and encoded on a worker thread (the Rust calls release the
# GIL), so one long prompt does not stall every stream.
_OFFLOAD_BYTES = 32 << 10
# Worker threads for that. Few: the heavy parts (JSON, rendering, encoding) release the GIL, but
# each conversion between Rust and Python objects holds it, and every thread waiting for the GIL
# delays the event loop's turn; encoding is itself parallel (the tokenizer's own threads).
_PREPARE_THREADS = 2

# The output cap of requests without max_tokens when the model's output is not a trained
# model's (tiny, dummy weights, zero-cost mode): long enough to see, short enough to wait for.
CANNED_MAX_TOKENS = 256

_GENERATE = {"/v1/chat/completions": CHAT, "/v1/responses": RESPONSES, "/v1/messages": MESSAGES}
_READ = ("/v1/models", "/health", "/metrics")


class App:
    def __init__(self, config: FrontendConfig, client: EngineClient, metrics: Metrics) -> None:
        self.config = config
        self.client = client
        self.metrics = metrics
        self.recipe: Recipe | None = None
        self.recipe_error: str | None = None
        self.draining = False
        self.local_workers = None  # the supervisor of the host's worker processes, if any
        self.started_at = int(time.time())
        self.auth = Authenticator(config, metrics)
        self.limits = RateLimiter(config.rate_limit_requests, config.rate_limit_tokens, metrics)
        self.allowed_origins = normalize(config.allowed_origins)
        self._pool = ThreadPoolExecutor(_PREPARE_THREADS, thread_name_prefix="prepare")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def load_recipe(self) -> None:
        """Build the protocol objects once the tokenizer is known (from config or a worker)."""
        if self.recipe is not None:
            return
        path = self.config.tokenizer or self.client.info("tokenizer")
        if path is None:
            # Before the workers are up none has reported its tokenizer yet: that is starting
            # (the plain 503), not a frontend started without one.
            ready = self.client.ready
            self.recipe_error = (
                "no tokenizer: start the frontend with --tokenizer" if ready else None
            )
            return
        try:
            fmt = PromptFormat.of_model_type(self.client.info("model_type") or "deepseek_v4")
            # Where the output is not a trained model's, no reasoning that never ends and no
            # answer that runs to the context length by default.
            canned = bool(self.client.info("random_weights") or self.client.info("zero_cost"))
            thinking = self.config.default_thinking
            if thinking is None:
                thinking = not canned
            cap = self.config.default_max_tokens
            if cap is None and canned:
                cap = CANNED_MAX_TOKENS
            self.recipe = Recipe(
                path, self.config.served_model_names, fmt, thinking, cap, self._images()
            )
            self.recipe_error = None
        except (RuntimeError, ValueError, OSError) as e:
            self.recipe_error = str(e)
            log.error("cannot serve generation requests: %s", e)

    def _images(self) -> ImageSupport | str:
        """What the recipe needs to take images when the workers do, else why they do not."""
        support = self.client.info("images")
        if not isinstance(support, dict):
            return support if isinstance(support, str) else nested.NO_IMAGES
        cfg = self.config
        urls = UrlPolicy.parse(cfg.image_url_hosts, cfg.image_url_allow_private)
        return ImageSupport(int(self.client.info("vocab_size")), urls)

    async def handle(self, req: HttpRequest) -> None:
        path = req.path.rstrip("/") or "/"
        try:
            origin = req.headers.get("origin")
            if origin is not None:
                self._check_origin(req, origin)
            api = _GENERATE.get(path)
            allow = "POST" if api is not None else "GET, HEAD" if path in _READ else None
            if req.method == "OPTIONS" and (allow is not None or path == "*"):
                # A CORS preflight carries no credentials: answered without a key.
                self._options(req, origin, allow)
                return
            key = self.auth.check(req, path)
            if allow is None and path != "*":
                raise ApiError(404, f"no route for {req.method} {req.path}")
            if allow is None or req.method not in allow.split(", "):
                raise ApiError(405, f"{path} takes {allow}", headers=[("allow", allow or "")])
            elif api is not None:
                _require_json(req)
                await self._generate(api, req, key)
            elif path == "/v1/models":
                self._models(req)
            elif path == "/health":
                self._health(req)
            else:
                self._metrics(req)
        except ApiError as e:
            if not req.started:
                req.respond(e.status, e.body(path), headers=e.headers)

    def _check_origin(self, req: HttpRequest, origin: str) -> None:
        """A page's request (it carries Origin): served when the page is of this host, or of
        an allowed origin (which then gets the CORS fields to read the answer)."""
        if same_host(origin, req.headers.get("host")):
            return
        if not origin_allowed(origin, self.allowed_origins):
            raise ApiError(
                403,
                f"cross-origin request from {origin!r} refused (start the server with "
                "--allowed-origins to allow it)",
            )
        req.extra_headers = cors_headers(origin)

    def _options(self, req: HttpRequest, origin: str | None, allow: str | None) -> None:
        allow = allow or "GET, HEAD, POST"
        if origin is not None and "access-control-request-method" in req.headers:
            asked = req.headers.get("access-control-request-headers", "")
            req.extra_headers = None  # the preflight's own fields say it all
            req.respond(204, b"", headers=[("allow", allow), *preflight_headers(origin, asked)])
        else:
            req.respond(204, b"", headers=[("allow", f"{allow}, OPTIONS")])

    # ---- generation ----------------------------------------------------------------------------

    async def _generate(self, api: Api, req: HttpRequest, key: str | None = None) -> None:
        """key: the id of the request's API key (None without API keys)."""
        if self.draining:
            raise ApiError(503, "the server is shutting down", headers=[("retry-after", "5")])
        self.limits.admit_request(key)
        if self.recipe is None:
            self.load_recipe()
        recipe = self.recipe
        if recipe is None:
            raise ApiError(
                503, self.recipe_error or "the server is starting", headers=[("retry-after", "2")]
            )
        max_model_len = self.client.info("max_model_len")
        if max_model_len is None:
            raise ApiError(503, "the server is starting", headers=[("retry-after", "2")])

        limit = int(max_model_len)
        if len(req.body) > _OFFLOAD_BYTES:
            loop = asyncio.get_running_loop()
            args = (recipe, api, req.body, limit)
            prep = await loop.run_in_executor(self._pool, _prepare_long, *args)
        else:
            prep = recipe.prepare(api, req.body, limit)
        try:
            if prep.pending is not None:  # images to fetch and preprocess: a worker thread's
                loop = asyncio.get_running_loop()
                prep = await loop.run_in_executor(self._pool, recipe.resolve_images, prep)
            if req.disconnected:
                prep.processor.close()
                return
            self.limits.admit_tokens(key, len(prep.prompt_ids))
        except ApiError:
            prep.processor.close()
            raise
        eos = frozenset(self.client.info("eos_token_ids") or ())
        sink_cls = SseSink if prep.stream else JsonSink
        sink = sink_cls(req, prep, eos)
        try:
            rid = self.client.submit(
                prep.prompt_ids,
                prep.params,
                prep.seed,
                self.limits.metered(key, sink),
                _cache_class(req, prep),
                prep.constraint,
                prep.images,
            )
        except Overloaded as e:
            prep.processor.close()
            self.metrics.request_done("rejected")
            raise ApiError(429, str(e), headers=[("retry-after", str(e.retry_after))]) from None

        def disconnected() -> None:
            if rid in self.client.requests:
                log.info("client disconnected: aborting %s", prep.response_id)
                self.client.abort(rid)
                sink.closed = True

        req.on_disconnect = disconnected

    # ---- the rest ------------------------------------------------------------------------------

    def description(self) -> str | None:
        """What the served model is, as its workers report it (None before they do)."""
        model = self.client.info("model")
        if model is None:
            return None
        family = self.client.info("model_type")
        if self.client.info("zero_cost"):
            return f"{model}: zero-cost mode, canned tokens without a model (measures the server)"
        if self.client.info("random_weights"):
            return (
                f"{model}: a {family} model with seeded random weights, for trying the server "
                "out; its output is random tokens"
            )
        return f"{model}: a {family} checkpoint"

    def _models(self, req: HttpRequest) -> None:
        card = {
            "object": "model",
            "created": self.started_at,
            "owned_by": "deepring",
            "max_model_len": self.client.info("max_model_len"),
            "description": self.description(),
        }
        body = {
            "object": "list",
            "data": [{"id": name, **card} for name in self.config.served_model_names],
        }
        req.respond(200, json.dumps(body).encode())

    def status(self) -> str:
        """ok: every expected worker is ready. degraded: some are missing (dead, restarting)
        but every role has a ready worker, so requests are served. starting / unavailable:
        a role has none (before the first one registers / after)."""
        if self.draining:
            return "draining"
        if self.client.ready:
            return "ok"
        if all(c["ready"] for c in self._capacity().values() if c["expected"]):
            return "degraded"
        return "starting" if not self.client.workers and not self._restarts() else "unavailable"

    def _restarts(self) -> int:
        return self.local_workers.report()["restarts"] if self.local_workers is not None else 0

    def _capacity(self) -> dict:
        """Per role: workers expected and ready (degraded mode shows here)."""
        expect = {"prefill": self.config.expect_prefill, "decode": self.config.expect_decode}
        return {
            role: {
                "expected": n,
                "ready": sum(w.role == role and w.load.ready for w in self.client.workers.values()),
            }
            for role, n in expect.items()
        }

    def _workers(self) -> list[dict]:
        out = []
        for w in sorted(self.client.workers.values(), key=lambda w: w.id):
            s = w.stats
            out.append(
                {
                    "worker": w.id,
                    "role": w.role,
                    "pid": w.pid,
                    "device": w.info.get("device"),
                    "up": 1 if w.load.ready else 0,
                    "queue_length": s.waiting if s else 0,
                    "running_requests": s.running if s else 0,
                    "kv_blocks_used": s.used_blocks if s else 0,
                    "kv_blocks_total": s.num_blocks if s else w.load.num_blocks,
                    "generated_tokens_total": s.generated if s else 0,
                    "steps_total": s.steps if s else 0,
                    "step_seconds_total": round(s.step_seconds, 6) if s else 0.0,
                    "compute_seconds_total": round(s.compute_seconds, 6) if s else 0.0,
                    "busy_seconds_total": round(s.busy_seconds, 6) if s else 0.0,
                    "preemptions_total": s.preemptions if s else 0,
                    # The worker's fitted step-time model (cost.model.FEATURES) and the
                    # prompt work it holds, in predicted seconds: what the cost router reads.
                    "step_cost": s.step_cost if s else [],
                    "backlog_seconds": round(s.backlog_s, 6) if s else 0.0,
                    "prefix_cache": s.prefix_cache if s else {},
                    "ring_dropped": s.dropped if s else {},
                    # A rank of an expert-parallel group: its group, slots, rebalances and
                    # the load-balance factor (max / mean tokens per rank per step).
                    "expert_parallel": s.expert_parallel if s else {},
                }
            )
        return out

    def _health(self, req: HttpRequest) -> None:
        status = self.status()
        body = {
            "status": status,
            "model": self.config.served_model_name,
            "requests_in_flight": len(self.client.requests),
            "capacity": self._capacity(),
            "workers": self._workers(),
        }
        if self.local_workers is not None:
            body["local_workers"] = self.local_workers.report()
        # Degraded still serves: a load balancer should keep sending requests here.
        code = 200 if status in ("ok", "degraded") else 503
        req.respond(code, json.dumps(body).encode())

    def _metrics(self, req: HttpRequest) -> None:
        frontend = {
            "requests_in_flight": len(self.client.requests),
            "requests_queued": self.client.queued,
            "draining": 1 if self.draining else 0,
            "degraded": 1 if self.status() == "degraded" else 0,
        }
        local = self.local_workers.report() if self.local_workers is not None else None
        text = self.metrics.render(frontend, self._workers(), self._capacity(), local)
        req.respond(200, text.encode(), content_type="text/plain; version=0.0.4")


__all__ = ["App", "error_body"]


def _prepare_long(recipe: Recipe, api: Api, body: bytes, max_model_len: int) -> Prepared:
    """Recipe.prepare on a worker thread, the prompt as the int32 array the ring sends: for a
    long prompt, a list of a million ids (and its conversion) holds the GIL for tens of
    milliseconds, which would be the event loop's too."""
    return recipe.prepare(api, body, max_model_len, as_array=True)


def _require_json(req: HttpRequest) -> None:
    """Generation takes JSON bodies only: a page of another site can send text/plain or form
    bodies without a CORS preflight, but not application/json."""
    given = req.headers.get("content-type", "")
    if given.partition(";")[0].strip().lower() != "application/json":
        what = f"got {given!r}" if given else "none was sent"
        raise ApiError(
            415,
            f"Content-Type must be application/json ({what})",
            headers=[("accept", "application/json")],
        )


def _cache_class(req: HttpRequest, prep: Prepared) -> str:
    """The prefix cache's TTL class: the X-DeepRing-Cache-Class header (agent | chat) when
    given, else the request's own (agent when it declares tools)."""
    given = req.headers.get("x-deepring-cache-class", "").strip().lower()
    if given and given not in CACHE_CLASSES:
        raise ApiError(400, f"X-DeepRing-Cache-Class must be one of {CACHE_CLASSES}, got {given!r}")
    return given or prep.cache_class
