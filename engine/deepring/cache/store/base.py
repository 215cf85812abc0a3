"""The interface of the prefix KV cache's persistent tiers, and what every tier shares: input
checks, counters, and how a failing backend degrades.

A tier is a cache, never the only copy of anything, so the serving path must not stop for it:
`get_many`, `put_many`, `delete_many` and `sweep` never raise when the backend fails (a dead
Redis, a full disk, a permission or I/O error). Their result degrades instead (misses, nothing
written), the failure is counted in `errors`, a warning is logged (at most one per `warn_every_s`
per store, on the `deepring.cache` logger), and the store leaves the backend alone for a while
(`backoff_s`, doubling with each failure in a row up to `max_backoff_s`) so that a dead server
costs each engine step nothing. The first call after the pause tries again; a success ends the
backoff and logs that the store works again. Bad arguments (a key that is not 32 bytes, a TTL
that is not a positive number) are the caller's bug and do raise.

Time comes from the store's `clock` (default `time.time`): expiry, backoff and the warning rate
all read it, so tests move time instead of sleeping.

TTL: every entry is stored with its TTL, and a hit renews it with that TTL: a hit keeps a prefix
alive for another full TTL.
"""

from __future__ import annotations

import abc
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import ClassVar, NamedTuple, TypeVar

from deepring.cache.store.frame import KEY_BYTES, ttl_to_ms

log = logging.getLogger("deepring.cache")

T = TypeVar("T")

COUNTERS = (
    "gets",  # keys looked up
    "hits",
    "misses",  # every key that returned None, whatever the reason
    "puts",  # blocks written
    "bytes_read",  # value bytes returned by hits
    "bytes_written",  # value bytes of the blocks written
    "errors",  # failed backend calls (each one starts or extends a backoff)
    "corrupt",  # entries found damaged or foreign (and removed)
    "expired",  # entries found past their expiry (and removed)
    "deleted",  # entries removed by delete_many and clear
)


class StoredBlock(NamedTuple):
    """One entry as `scan` reports it."""

    key: bytes
    size: int  # bytes of the value, the store's framing excluded
    expires_at: float  # on the store's clock; inf for an entry without expiry


class StoreUnavailable(Exception):
    """The store cannot be opened, scanned or cleared (the calls outside the serving path,
    which report a failure instead of degrading)."""


class Backoff:
    """How long a failing backend is left alone: `first_s` after a failure, doubling with each
    failure in a row up to `max_s`; a success resets it. Not thread-safe (the store locks)."""

    def __init__(self, first_s: float = 0.5, max_s: float = 30.0) -> None:
        if not (math.isfinite(first_s) and math.isfinite(max_s) and 0 <= first_s <= max_s):
            raise ValueError(f"backoff needs 0 <= first_s <= max_s, got {first_s}, {max_s}")
        self.first_s, self.max_s = first_s, max_s
        self.failures = 0
        self._delay = 0.0
        self._since = self._until = -math.inf

    def ready(self, now: float) -> bool:
        """Whether the backend may be tried at `now` (also when the clock went back)."""
        return not (self._since <= now < self._until)

    def fail(self, now: float) -> float:
        """Records a failure at `now`; returns the pause it starts."""
        self._delay = self.first_s if self.failures == 0 else min(self.max_s, self._delay * 2)
        self.failures += 1
        self._since, self._until = now, now + self._delay
        return self._delay

    def succeed(self) -> int:
        """Records a success; returns how many failures in a row it ends."""
        failures, self.failures = self.failures, 0
        self._delay, self._since, self._until = 0.0, -math.inf, -math.inf
        return failures


def check_key(key: bytes) -> bytes:
    """`key` itself when it is a 32-byte `bytes`; TypeError or ValueError otherwise."""
    if not isinstance(key, bytes):
        raise TypeError(f"a block key is bytes, got {type(key).__name__}")
    if len(key) != KEY_BYTES:
        raise ValueError(f"a block key is {KEY_BYTES} bytes, got {len(key)}")
    return key


class BlockStore(abc.ABC):
    """A persistent tier of the prefix KV cache: opaque block values under 32-byte keys, each
    with a TTL. Subclasses implement the `_get`, `_put`, `_delete`, `_sweep`, `_scan` and
    `_clear` hooks; this class checks arguments, counts, and turns backend failures (the
    exception types in `failures`) into degraded results."""

    kind: ClassVar[str] = "abstract"
    # The exceptions that mean "the backend is failing" rather than "this code has a bug".
    failures: ClassVar[tuple[type[BaseException], ...]] = (OSError,)

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        warn_every_s: float = 10.0,
    ) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._backoff = Backoff(backoff_s, max_backoff_s)
        self._warn_every_s = warn_every_s
        self._warned_at = -math.inf
        self._unwarned = 0  # failures since the last warning

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where the store is, in the form `open_store` takes (without a password)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __enter__(self) -> BlockStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the interface ---------------------------------------------------------------------

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The value of each key, in order; None for a key that is missing, expired or damaged,
        and for every key while the backend fails. A hit renews the entry for its full TTL."""
        keys = [check_key(k) for k in keys]
        if not keys:
            return []
        now = self.clock()
        found = self._attempt("get", lambda: self._get(keys, now), now)
        values: list[bytes | None] = found + [None] * (len(keys) - len(found))
        hits = [v for v in values if v is not None]
        self._count(
            gets=len(keys),
            hits=len(hits),
            misses=len(keys) - len(hits),
            bytes_read=sum(len(v) for v in hits),
        )
        return values

    def put_many(self, items: list[tuple[bytes, bytes, float]]) -> int:
        """Stores each (key, value, ttl seconds), replacing what the key held; returns how many
        were written (fewer, down to 0, when the backend fails)."""
        checked: list[tuple[bytes, bytes, int]] = []
        for key, value, ttl_s in items:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f"a block value is bytes, got {type(value).__name__}")
            checked.append((check_key(key), bytes(value), ttl_to_ms(ttl_s)))
        if not checked:
            return 0
        now = self.clock()
        written = self._attempt("put", lambda: self._put(checked, now), now)
        ok = [value for (_, value, _), done in zip(checked, written, strict=False) if done]
        self._count(puts=len(ok), bytes_written=sum(len(v) for v in ok))
        return len(ok)

    def delete_many(self, keys: list[bytes]) -> int:
        """Removes the keys; returns how many were present."""
        keys = [check_key(k) for k in keys]
        if not keys:
            return 0
        now = self.clock()
        removed = sum(self._attempt("delete", lambda: self._delete(keys), now))
        self._count(deleted=removed)
        return removed

    def sweep(self) -> int:
        """Removes expired entries (and what else the store leaves behind, e.g. damaged entries
        and abandoned temporary files); returns how many it removed."""
        now = self.clock()
        return sum(self._attempt("sweep", lambda: self._sweep(now), now))

    def scan(self) -> Iterator[StoredBlock]:
        """Every entry, expired ones included, in no particular order, for inspection. Entries
        that are damaged or foreign are left out. StoreUnavailable when the backend fails."""
        try:
            yield from self._scan(self.clock())
        except self.failures as e:
            raise StoreUnavailable(f"{self.url}: {type(e).__name__}: {e}") from e

    def clear(self) -> int:
        """Removes every entry; returns how many. StoreUnavailable when the backend fails."""
        try:
            removed = self._clear()
        except self.failures as e:
            raise StoreUnavailable(f"{self.url}: {type(e).__name__}: {e}") from e
        self._count(deleted=removed)
        return removed

    def close(self) -> None:  # noqa: B027 -- a store without connections has nothing to close
        """Releases connections and handles; the store is not used afterwards."""

    def stats(self) -> dict[str, int]:
        """A snapshot of the counters (see COUNTERS)."""
        with self._lock:
            return dict(self._counts)

    # -- backend hooks ---------------------------------------------------------------------
    # Each yields one result per item, in order, so that a failure part-way keeps what was
    # done before it. They raise one of `failures` when the backend fails.

    @abc.abstractmethod
    def _get(self, keys: list[bytes], now: float) -> Iterator[bytes | None]:
        """Each key's value (None: a miss), renewing the TTL of hits."""

    @abc.abstractmethod
    def _put(self, items: list[tuple[bytes, bytes, int]], now: float) -> Iterator[bool]:
        """Writes each (key, value, TTL in ms); True for each written."""

    @abc.abstractmethod
    def _delete(self, keys: list[bytes]) -> Iterator[bool]:
        """Removes each key; True for each that was present."""

    @abc.abstractmethod
    def _sweep(self, now: float) -> Iterator[int]:
        """Removes what is stale; yields the number removed, in any steps."""

    @abc.abstractmethod
    def _scan(self, now: float) -> Iterator[StoredBlock]:
        """Every valid entry."""

    @abc.abstractmethod
    def _clear(self) -> int:
        """Removes every entry; returns how many."""

    # -- shared machinery ------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def _attempt(self, op: str, run: Callable[[], Iterable[T]], now: float) -> list[T]:
        """The results `run` yields before it ends or fails; none while backing off."""
        with self._lock:
            if not self._backoff.ready(now):
                return []
        done: list[T] = []
        try:
            for result in run():
                done.append(result)
        except self.failures as e:
            self._failed(op, e, now)
        else:
            if self._backoff.failures:  # read without the lock: a stale value only delays
                self._recovered()
        return done

    def _failed(self, op: str, exc: BaseException, now: float) -> None:
        with self._lock:
            self._counts["errors"] += 1
            pause = self._backoff.fail(now)
            warn = not (self._warned_at <= now < self._warned_at + self._warn_every_s)
            if warn:
                self._warned_at = now
                quiet, self._unwarned = self._unwarned, 0
            else:
                self._unwarned += 1
        if warn:
            log.warning(
                "kv store %s: %s failed (%s: %s); not trying it again for %.1f s%s",
                self.url,
                op,
                type(exc).__name__,
                exc,
                pause,
                f" ({quiet} more failures since the last warning)" if quiet else "",
            )

    def _recovered(self) -> None:
        with self._lock:
            failures = self._backoff.succeed()
        if failures:
            log.info("kv store %s: working again after %d failed calls", self.url, failures)
