"""`deepring serve`: the frontend in this process and its local worker processes, which the
supervisor here starts (spawn), watches, restarts and stops.

Each worker is a fresh interpreter (multiprocessing's spawn start method, never fork: the
frontend holds sockets, threads and an event loop that a forked child must not inherit). Its
exit is noticed at once through the process sentinel on the event loop; the frontend then
fails the requests it held and the supervisor starts a new incarnation after a short backoff.
A worker that dies before it ever became ready is a configuration or start-up error: the
supervisor reports it and gives up instead of looping.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from deepring import env
from deepring.config import ServeConfig, WorkerConfig
from deepring.frontend import server
from deepring.frontend.client import EngineClient
from deepring.logs import setup_logging
from deepring.spares import Spares
from deepring.worker.process import run_worker

log = logging.getLogger("deepring.supervisor")

_BACKOFF_START = 0.5
_BACKOFF_MAX = 10.0
# A worker that stayed up this long restarts without backoff next time.
_STABLE_AFTER = 60.0


@dataclass(eq=False)
class _Child:
    config: WorkerConfig
    process: multiprocessing.process.BaseProcess
    started: float
    backoff: float = _BACKOFF_START
    exits: deque[float] = field(default_factory=deque)  # recent unexpected exits (monotonic)
    restarts: int = 0
    last_exit: str = ""
    down_since: float | None = None  # exited, not running again yet


class Supervisor:
    def __init__(
        self,
        configs: tuple[WorkerConfig, ...],
        client: EngineClient,
        on_fatal: Callable[[str], None],
        reserves: int = 0,
    ) -> None:
        self.configs = configs
        self.client = client
        self.on_fatal = on_fatal
        self.ctx = multiprocessing.get_context("spawn")
        self.children: dict[str, _Child] = {}
        self.stopping = False
        self.restarts = 0
        self.crash_loop_exits, self.crash_loop_window = env.crash_loop()
        self._loop = asyncio.get_running_loop()
        self.spares = Spares(reserves, configs[-1], self.ctx, self._loop)

    def start(self) -> None:
        for cfg in self.configs:
            self._spawn(cfg, _BACKOFF_START)
        self.spares.start()

    def pids(self) -> dict[str, int | None]:
        return {wid: c.process.pid for wid, c in self.children.items()}

    def _spawn(
        self,
        cfg: WorkerConfig,
        backoff: float,
        prev: _Child | None = None,
        process: multiprocessing.process.BaseProcess | None = None,
    ) -> None:
        """Start the worker `cfg` describes (process: a spare already becoming it)."""
        p = process
        if p is None:
            p = self.ctx.Process(target=run_worker, args=(cfg,), name=cfg.worker_id, daemon=True)
            p.start()
        child = _Child(cfg, p, time.monotonic(), backoff)
        if prev is not None:  # a restart keeps the worker's history
            child.exits, child.restarts, child.last_exit = prev.exits, prev.restarts, prev.last_exit
        self.children[cfg.worker_id] = child
        self._loop.add_reader(p.sentinel, self._exited, cfg.worker_id, p)
        log.info("started %s (pid %s)", cfg.worker_id, p.pid)

    def _exited(self, wid: str, p: multiprocessing.process.BaseProcess) -> None:
        self._loop.remove_reader(p.sentinel)
        p.join()
        child = self.children.get(wid)
        if child is None or child.process is not p:
            return
        code = p.exitcode
        if self.stopping:
            return
        was_ready = p.pid in self.client.registry.seen_pids
        why = f"exited unexpectedly with code {code}"
        self.client.worker_lost(wid, why, f"pid {p.pid}")
        if not was_ready:
            self.on_fatal(
                f"worker {wid} (pid {p.pid}) {why} before it became ready; see its log above"
            )
            return
        now = time.monotonic()
        up_for = now - child.started
        backoff = _BACKOFF_START if up_for > _STABLE_AFTER else min(child.backoff * 2, _BACKOFF_MAX)
        child.exits.append(now)
        while child.exits and now - child.exits[0] > self.crash_loop_window:
            child.exits.popleft()
        child.last_exit, child.down_since = why, now
        if self._crash_looping(child):
            # Still restarted (the cause may pass), but said loudly, in the log, /health and
            # /metrics, instead of a quiet restart every few seconds.
            backoff = _BACKOFF_MAX
            log.error(
                "%s is crash-looping: %d exits in %.0fs (last: %s); restarting in %.1fs",
                wid, len(child.exits), self.crash_loop_window, why, child.backoff,
            )  # fmt: skip
        else:
            log.warning("%s %s; restarting in %.1fs", wid, why, child.backoff)
        self.restarts += 1
        child.restarts += 1
        spare = self.spares.take(child.config)
        if spare is not None:  # a warm spare takes the role now; no model to load
            self._spawn(child.config, backoff, child, process=spare)
            return
        self._loop.call_later(child.backoff, self._restart, child, backoff)

    def _crash_looping(self, child: _Child) -> bool:
        return len(child.exits) >= self.crash_loop_exits

    def _restart(self, child: _Child, backoff: float) -> None:
        if not self.stopping:
            self._spawn(child.config, backoff, child)

    def report(self) -> dict:
        """What /health and /metrics say about the local workers: restarts, the ones down and
        waiting to restart, and the crash-looping ones."""
        now = time.monotonic()
        out = {"restarts": self.restarts, "spares": self.spares.report(), "workers": {}}
        for wid, c in sorted(self.children.items()):
            alive = c.process.is_alive()
            out["workers"][wid] = {
                "restarts": c.restarts,
                "running": alive,
                "down_for_s": round(now - c.down_since, 1) if c.down_since and not alive else 0.0,
                "crash_loop": self._crash_looping(c),
                "last_exit": c.last_exit,
            }
        return out

    async def stop(self, timeout: float = 10.0) -> None:
        """Tell every worker to stop, wait up to `timeout`, then terminate the rest."""
        self.stopping = True
        self.spares.stop()
        self.client.shutdown_workers(drain=False)
        deadline = time.monotonic() + timeout
        procs = [c.process for c in self.children.values()]
        registered = {w.pid for w in self.client.workers.values()}
        for p in procs:
            # Still starting (it cannot hear a Shutdown yet and holds no requests): stop it now.
            if p.is_alive() and p.pid not in registered:
                p.kill()
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for p in procs:
            if p.is_alive():
                log.warning("%s did not stop; terminating it", p.name)
                p.kill()
            p.join(timeout=5)
            self._loop.remove_reader(p.sentinel)
            p.close()
        self.children.clear()


def run(config: ServeConfig) -> int:
    """Serve with local workers until SIGTERM; returns the exit code."""
    setup_logging("frontend")
    fe = config.frontend
    secured = "CURVE" if fe.ring_keys else ("insecure" if fe.insecure_ring else "local")
    log.info("ring on %s (%s)", fe.ring_addr, secured)

    def start_workers(client: EngineClient, on_fatal: Callable[[str], None]) -> Supervisor:
        return Supervisor(config.workers, client, on_fatal, config.reserve_workers)

    return server.run(config.frontend, start_workers)
