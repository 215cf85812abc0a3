"""A background thread that sweeps a store now and then, so that expired entries of a directory
store do not pile up between the reads that would find them."""

from __future__ import annotations

import logging
import math
import threading

from deepring.cache.store.base import BlockStore

log = logging.getLogger("deepring.cache")


class Sweeper:
    """Calls `store.sweep()` every `interval_s` seconds (the first one an interval after
    `start()`) on a daemon thread. An exception from a sweep is logged and the thread goes on;
    `stop()` ends it."""

    def __init__(self, store: BlockStore, interval_s: float) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"a sweep interval must be a positive number, got {interval_s!r}")
        self.store = store
        self.interval_s = interval_s
        self.runs = 0  # sweeps done
        self.removed = 0  # entries they removed
        self.failures = 0  # sweeps that raised
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kv-store-sweeper", daemon=True)

    def start(self) -> Sweeper:
        """Starts the thread; returns self."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Asks the thread to end and waits for it up to `timeout_s` (a sweep under way is not
        interrupted); returns whether it has ended."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def __enter__(self) -> Sweeper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sweep_once(self) -> int:
        """One sweep, as the thread runs it; returns how many entries it removed."""
        try:
            removed = self.store.sweep()
        except Exception:
            # A store's sweep does not raise for backend failures, so this is a bug; a bug in
            # one sweep must not end the sweeping.
            log.exception("kv store %s: sweep raised", self.store.url)
            self.failures += 1
            return 0
        self.runs += 1
        self.removed += removed
        return removed

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sweep_once()
