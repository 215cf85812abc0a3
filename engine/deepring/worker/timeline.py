"""A worker's step timeline as a Chrome trace (opens in Perfetto or chrome://tracing).

The loop thread's spans: the ring's work (`poll`, `messages`) and the role's `step`, inside it
the engine's: sequentially (`--no-overlap`) `schedule` (the scheduler), `compute` (the runner:
the model's forward and the sampler) and `post` (tokens appended, stop conditions, the prefix
cache's bookkeeping); overlapped (core.overlap) `schedule` (the next step, planned while this
one computes), `wait` (for this one's tokens), `launch` (the next one) and `post`, with each
step's `compute` on a track of its own. What is not `compute` or `wait` is the CPU time around
the model, the part the overlapped engine runs while a step computes.

The file is the JSON Array Format: `[` then one event per line, each followed by a comma; a
worker that dies mid-run leaves a file the viewers still open (the closing `]` is optional).
Writing stops after `max_events` (a bounded file on a long run); a line in the log says so.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

log = logging.getLogger("deepring.worker")

MAX_EVENTS = 1_000_000  # ~100 MB of trace: hours of steps at a few ms each
FLUSH_S = 0.5  # what is written reaches the file within this (a live worker's trace is readable)


class Timeline:
    """Spans of one worker (`path` None: nothing is recorded, every call is a no-op)."""

    def __init__(
        self,
        path: Path | None,
        worker: str,
        clock: Callable[[], float] = time.perf_counter,
        max_events: int = MAX_EVENTS,
    ) -> None:
        self.clock = clock
        self.max_events = max_events
        self.events = 0
        self._pid = os.getpid()
        self._tids: dict[str, int] = {}  # trace thread per name: "loop", "compute" (overlapped)
        self._t0 = clock()
        self._flushed_at = self._t0
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
            self._file.write("[\n")
            self._meta("process_name", {"name": worker}, 0)
            self._tid("loop")

    @property
    def on(self) -> bool:
        return self._file is not None

    def _meta(self, name: str, args: dict, tid: int) -> None:
        ev = {"name": name, "ph": "M", "pid": self._pid, "tid": tid, "args": args}
        self._write(ev)

    def _tid(self, thread: str) -> int:
        tid = self._tids.get(thread)
        if tid is None:
            tid = self._tids[thread] = len(self._tids) + 1
            self._meta("thread_name", {"name": thread}, tid)
        return tid

    def _write(self, event: dict) -> None:
        f = self._file
        if f is None:
            return
        if self.events >= self.max_events:
            log.info("timeline: %d events written, the rest of the run is not traced", self.events)
            self.close()
            return
        f.write(json.dumps(event, separators=(",", ":")) + ",\n")
        self.events += 1
        now = self.clock()
        if now - self._flushed_at > FLUSH_S:
            f.flush()
            self._flushed_at = now

    def add(
        self, name: str, start: float, end: float, args: dict | None = None, thread: str = "loop"
    ) -> None:
        """A span from `start` to `end` (seconds on `clock`) on `thread`'s track."""
        if self._file is None:
            return
        ev = {
            "name": name,
            "ph": "X",
            "ts": round((start - self._t0) * 1e6, 1),
            "dur": round(max(0.0, end - start) * 1e6, 1),
            "pid": self._pid,
            "tid": self._tid(thread),
        }
        if args:
            ev["args"] = args
        self._write(ev)

    @contextmanager
    def span(self, name: str, args: dict | None = None) -> Iterator[None]:
        if self._file is None:
            yield
            return
        start = self.clock()
        try:
            yield
        finally:
            self.add(name, start, self.clock(), args)

    def step(self, phases: tuple[float, float, float, float] | None, args: dict) -> None:
        """The engine's last sequential step (EngineCore.last_phases) as schedule / compute /
        post on the loop thread."""
        if self._file is None or phases is None:
            return
        t0, t1, t2, t3 = phases
        self.add("schedule", t0, t1)
        self.add("compute", t1, t2, args)
        self.add("post", t2, t3)

    def close(self) -> None:
        f = self._file
        if f is None:
            return
        end = {"name": "end", "ph": "i", "s": "p", "pid": self._pid, "tid": self._tid("loop"),
               "ts": round((self.clock() - self._t0) * 1e6, 1)}  # fmt: skip
        f.write(json.dumps(end, separators=(",", ":")) + "\n]\n")  # (no comma after the last)
        f.close()
        self._file = None
