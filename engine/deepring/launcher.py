"""`deepring serve`: the frontend in this process and its local worker processes, which the
supervisor here starts (spawn), watches, restarts and stops.

Each worker is a fresh interpreter (multiprocessing's spawn start method, never fork: the
frontend holds sockets, threads and an event loop that a forked child must not inherit). Its
exit is noticed at once through the process sentinel on the event loop; the frontend then
fails the requests it held and the supervisor starts a new incarnation after a short backoff.
A worker that dies before it ever became ready is a configuration or start-up error: the
supervisor reports it and gives up instead of looping.

The ranks of an expert-parallel group (`--ep N`, worker.ep_rank) live and die together: their
MoE layers cannot step without every rank. When one exits, the supervisor kills the others,
the frontend reroutes what each of them held, and once all are down the group starts again,
on a fresh rendezvous port, after the failed rank's backoff. A rank that hangs or is frozen
without exiting is found by its missed heartbeats (the frontend's timeout, seconds, not the
group's collective timeout, minutes) and killed, which takes its group down the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from deepring import env
from deepring.config import ServeConfig, WorkerConfig, free_tcp
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
    silenced: str = ""  # why the supervisor killed it (a silent expert-parallel rank)


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
        # Expert-parallel groups: (role, group) -> worker ids of its ranks; the groups going
        # down (a rank exited), with the backoff their restart waits; those whose restart is
        # scheduled (once: every rank's exit checks whether the group is down).
        self.groups: dict[tuple[str, int], list[str]] = {}
        for cfg in configs:
            if cfg.ep is not None:
                self.groups.setdefault(_group(cfg), []).append(cfg.worker_id)
        self.falling: dict[tuple[str, int], float] = {}
        self.regrouping: set[tuple[str, int]] = set()
        client.on_silent = self._silent

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
        key = _group(child.config)
        if key is not None and key in self.falling:  # a rank stopped with its group
            # (Or killed for silence itself, in the same heartbeat as the rank that took the
            # group down: its report says so.)
            why = child.silenced or "went down with its expert-parallel group"
            self.client.worker_lost(wid, why, f"pid {p.pid}")
            child.last_exit, child.down_since = why, time.monotonic()
            child.restarts += 1
            self.restarts += 1
            self._restart_group_when_down(key)
            return
        was_ready = p.pid in self.client.registry.seen_pids
        why = child.silenced or f"exited unexpectedly with code {code}"
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
        if key is not None:
            self._take_group_down(key, wid, backoff)
            return
        spare = self.spares.take(child.config)
        if spare is not None:  # a warm spare takes the role now; no model to load
            self._spawn(child.config, backoff, child, process=spare)
            return
        self._loop.call_later(child.backoff, self._restart, child, backoff)

    def _silent(self, wid: str, pid: int) -> None:
        """The frontend declared `wid` dead for missed heartbeats. A hung or frozen
        expert-parallel rank holds its whole group: the other ranks wait in their next
        collective until the group timeout (worker.ep_rank.GROUP_TIMEOUT_S, minutes). It is
        killed: its exit takes the group down and restarts it (_exited), and the frontend has
        rerouted its requests already. Its peers, silent too while they wait on it, go the
        same way. Other workers are left alone: a frozen one re-registers when it thaws."""
        child = self.children.get(wid)
        if child is None or self.stopping or child.process.pid != pid:
            return  # not ours (another frontend's), or an incarnation already replaced
        key = _group(child.config)
        if key is None or key in self.falling or not child.process.is_alive():
            return
        log.warning("killing %s (pid %s): a silent expert-parallel rank holds its group", wid, pid)
        child.silenced = "was killed: silent for the heartbeat timeout (hung or frozen)"
        child.process.kill()

    def _take_group_down(self, key: tuple[str, int], failed: str, backoff: float) -> None:
        """Rank `failed` of group `key` exited: stop the other ranks (their collectives would
        fail anyway, or hang until the group timeout), restart all once they are down."""
        self.falling[key] = backoff
        for wid in self.groups[key]:
            p = self.children[wid].process
            if wid != failed and p.is_alive():
                log.warning("stopping %s: rank %s of its expert-parallel group exited", wid, failed)
                p.kill()
        self._restart_group_when_down(key)

    def _restart_group_when_down(self, key: tuple[str, int]) -> None:
        members = [self.children[wid] for wid in self.groups[key]]
        if key in self.regrouping or any(c.process.is_alive() for c in members):
            return  # scheduled already, or the exits of the rest are on their way
        self.regrouping.add(key)
        backoff = self.falling[key]
        delay = max(c.backoff for c in members)
        log.warning("expert-parallel group %s-%d restarts in %.1fs", *key, delay)
        self._loop.call_later(delay, self._restart_group, key, backoff)

    def _restart_group(self, key: tuple[str, int], backoff: float) -> None:
        self.falling.pop(key, None)
        self.regrouping.discard(key)
        if self.stopping:
            return
        # A fresh rendezvous: a rank of the old group can never join the new one.
        addr = free_tcp()
        for wid in self.groups[key]:
            prev = self.children[wid]
            cfg = prev.config
            cfg = dataclasses.replace(cfg, ep=dataclasses.replace(cfg.ep, init_addr=addr))
            self._spawn(cfg, backoff, prev)

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


def _group(cfg: WorkerConfig) -> tuple[str, int] | None:
    """The expert-parallel group a worker is a rank of (None: a whole worker)."""
    return None if cfg.ep is None else (cfg.role, cfg.ep.group)


def run(config: ServeConfig) -> int:
    """Serve with local workers until SIGTERM; returns the exit code."""
    setup_logging("frontend")
    fe = config.frontend
    secured = "CURVE" if fe.ring_keys else ("insecure" if fe.insecure_ring else "local")
    log.info("ring on %s (%s)", fe.ring_addr, secured)

    def start_workers(client: EngineClient, on_fatal: Callable[[str], None]) -> Supervisor:
        return Supervisor(config.workers, client, on_fatal, config.reserve_workers)

    return server.run(config.frontend, start_workers)
