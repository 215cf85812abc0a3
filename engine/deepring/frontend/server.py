"""Running the frontend: `deepring frontend`, and the frontend half of `deepring serve`.

Start-up: bind the ring, listen on HTTP at once (/health answers 503 "starting" until every
expected worker is ready), start the local workers (when the launcher passes a way to), print
one line when ready.
SIGTERM / SIGINT: stop taking connections and requests (503), let in-flight requests finish
for up to the drain timeout, end the rest with an error, stop the workers, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import sys
import time
from collections.abc import Callable
from typing import Protocol

import zmq

from deepring.config import FrontendConfig
from deepring.frontend.app import App
from deepring.frontend.client import EngineClient
from deepring.frontend.http import HttpLimits, HttpServer, default_max_connections, fd_budget
from deepring.frontend.metrics import Metrics
from deepring.protocol.errors import error_body

log = logging.getLogger("deepring.frontend")


class LocalWorkers(Protocol):
    """Worker processes the frontend's host runs (the launcher's supervisor)."""

    def start(self) -> None: ...
    async def stop(self, timeout: float = 10.0) -> None: ...
    def report(self) -> dict: ...


# (the ring client, a callback that stops the server with a message) -> the local workers.
StartWorkers = Callable[[EngineClient, Callable[[str], None]], LocalWorkers]


async def serve(config: FrontendConfig, start_workers: StartWorkers | None = None) -> int:
    loop = asyncio.get_running_loop()
    metrics = Metrics()
    client = EngineClient(config, metrics)
    try:
        client.start(loop)
    except (zmq.ZMQError, ValueError) as e:  # ValueError: its CURVE keys (ipc.ring_keys)
        print(f"deepring: cannot bind the ring at {config.ring_addr}: {e}", file=sys.stderr)
        client.close()
        return 1
    app = App(config, client, metrics)
    http = HttpServer(app.handle, error_body, http_limits(config))
    metrics.http_refused = lambda: dict(http.refused)
    stop = asyncio.Event()
    fatal: list[str] = []

    def on_fatal(message: str) -> None:
        fatal.append(message)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app.auth.install(loop)  # SIGHUP re-reads the API keys file
    workers: LocalWorkers | None = None
    try:
        try:
            port = await http.start(config.host, config.port)
        except OSError as e:
            print(
                f"deepring: cannot listen on {config.host}:{config.port}: {e.strerror or e}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        url = f"http://{config.host}:{port}"
        print(f"deepring: listening on {url} (waiting for workers)", flush=True)
        if start_workers is not None:
            workers = start_workers(client, on_fatal)
            app.local_workers = workers
            workers.start()
        ready = asyncio.ensure_future(client.wait_ready())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if not stop.is_set():
            app.load_recipe()
            print(f"deepring: ready on {url} (model {config.served_model_name!r})", flush=True)
            await stopped
        else:
            stopped.cancel()
        await _drain(app, client, http, config.drain_timeout if not fatal else 0.0)
    finally:
        if workers is not None:
            await workers.stop()
        http.close_all()
        client.close()
        app.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        app.auth.uninstall(loop)
    if fatal:
        print(f"deepring: {fatal[0]}", file=sys.stderr, flush=True)
        return 1
    print("deepring: stopped", flush=True)
    return 0


def http_limits(config: FrontendConfig) -> HttpLimits:
    """The HTTP server's limits; warns when --max-connections exceeds what the open-file limit
    allows (accept() then fails with EMFILE, and the event loop backs off)."""
    cap = config.max_connections
    if cap is None:
        cap = default_max_connections()
    else:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and fd_budget(cap) > soft:
            log.warning(
                "--max-connections %d may need %d file descriptors, over the open-file limit "
                "(%d; see ulimit -n)",
                cap,
                fd_budget(cap),
                soft,
            )
    return HttpLimits(
        max_body_bytes=config.max_body_bytes,
        header_timeout=config.header_timeout,
        body_timeout=config.body_timeout,
        keepalive_timeout=config.keepalive_timeout,
        write_timeout=config.write_timeout,
        max_connections=cap,
    )


async def _drain(app: App, client: EngineClient, http: HttpServer, timeout: float) -> None:
    app.draining = True
    http.stop_listening()
    n = len(client.requests)
    if n:
        log.info("draining %d in-flight requests (up to %.0fs)", n, timeout)
    deadline = time.monotonic() + timeout
    while client.requests and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    client.fail_all("the server shut down before the request finished")
    # Give the last writes a moment to reach the sockets.
    await asyncio.sleep(0.05)


def run(config: FrontendConfig, start_workers: StartWorkers | None = None) -> int:
    """Run the frontend (and its local workers) until SIGTERM; returns the exit code."""
    try:
        import uvloop
    except ImportError:  # uvloop is not available on every platform
        return asyncio.run(serve(config, start_workers))
    return uvloop.run(serve(config, start_workers))
