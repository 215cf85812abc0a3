"""Warm spares of `deepring serve --reserve-workers K`: worker processes that load the model
and wait, so that a failed worker's role is taken over at once instead of after a model load.

A spare is a child of the supervisor (worker.process.run_spare) holding one end of a pipe. It
sends "loaded" once its weights are in memory; the supervisor then may hand it a failed
worker's WorkerConfig, and the spare becomes that worker (same id, endpoints and engine spec;
a new incarnation to the frontend). Each spare taken is replaced by a new one. A spare that
dies while waiting is started again after a pause.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from dataclasses import dataclass

from deepring.config import WorkerConfig
from deepring.worker.process import run_spare

log = logging.getLogger("deepring.supervisor")

_RESPAWN_S = 2.0  # pause before replacing a spare that died or was taken


@dataclass(eq=False)
class Spare:
    index: int
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    started: float
    loaded: bool = False


class Spares:
    def __init__(self, count: int, base: WorkerConfig, ctx, loop: asyncio.AbstractEventLoop):
        if count < 0:
            raise ValueError("the number of spare workers must be >= 0")
        self.count = count
        self.base = base  # what a spare loads: the model of every worker
        self.ctx = ctx
        self.loop = loop
        self.spares: dict[int, Spare] = {}
        self.taken = 0
        self.stopping = False

    def start(self) -> None:
        for i in range(self.count):
            self._spawn(i)

    def _spawn(self, index: int) -> None:
        if self.stopping:
            return
        cfg = self.base  # its engine spec is what a spare loads (every worker's model)
        parent, child = self.ctx.Pipe()
        name = f"spare-{index}"
        p = self.ctx.Process(target=run_spare, args=(cfg, child, name), name=name, daemon=True)
        p.start()
        child.close()
        spare = Spare(index, p, parent, time.monotonic())
        self.spares[index] = spare
        self.loop.add_reader(parent.fileno(), self._said, spare)
        self.loop.add_reader(p.sentinel, self._died, spare)
        log.info("started spare-%d (pid %s)", index, p.pid)

    def _said(self, spare: Spare) -> None:
        try:
            msg = spare.conn.recv()
        except (EOFError, OSError):
            self.loop.remove_reader(spare.conn.fileno())
            return
        if msg == "loaded":
            spare.loaded = True
            log.info("spare-%d is ready to take over a worker", spare.index)

    def _died(self, spare: Spare) -> None:
        self._forget(spare)
        spare.process.join()
        if self.stopping or self.spares.get(spare.index) is not None:
            return
        log.warning(
            "spare-%d (pid %s) exited with code %s; starting another in %.0fs",
            spare.index, spare.process.pid, spare.process.exitcode, _RESPAWN_S,
        )  # fmt: skip
        self.loop.call_later(_RESPAWN_S, self._spawn, spare.index)

    def _forget(self, spare: Spare) -> None:
        """Stop watching a spare (it died, or it became a worker the supervisor watches)."""
        if self.spares.get(spare.index) is spare:
            del self.spares[spare.index]
        for fd in (spare.conn.fileno(), spare.process.sentinel):
            self.loop.remove_reader(fd)

    def take(self, config: WorkerConfig) -> multiprocessing.process.BaseProcess | None:
        """A loaded spare becomes the worker `config` describes (its process is returned, for
        the supervisor to watch from now on), and another spare starts loading. None when no
        spare is loaded."""
        ready = [s for s in self.spares.values() if s.loaded and s.process.is_alive()]
        if not ready:
            return None
        spare = min(ready, key=lambda s: s.started)
        self._forget(spare)
        try:
            spare.conn.send(config)
        except OSError:
            return None
        spare.conn.close()
        self.taken += 1
        log.warning(
            "spare-%d (pid %s) takes over %s", spare.index, spare.process.pid, config.worker_id
        )
        self.loop.call_later(_RESPAWN_S, self._spawn, spare.index)
        return spare.process

    def report(self) -> dict:
        return {
            "configured": self.count,
            "loaded": sum(s.loaded for s in self.spares.values()),
            "taken": self.taken,
        }

    def stop(self) -> None:
        self.stopping = True
        for spare in list(self.spares.values()):
            self._forget(spare)
            spare.conn.close()
            if spare.process.is_alive():
                spare.process.kill()
            spare.process.join(timeout=5)
