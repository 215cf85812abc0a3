"""Counting and reporting ring messages a process drops.

A peer that sends junk (a bug, a stray client, an attacker) must cost a counter increment, not a
log line per frame and never a traceback: `DropLog.drop` counts by reason and logs at most one
warning per reason per interval, with the number dropped since the last one. What gets logged
is printable by construction (`printable`): a routing id or a field value from the wire is
shown as text only when it is short printable ASCII, otherwise as a hex prefix, so raw bytes
never reach a terminal or a log collector.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# Reasons a message is dropped (the `reason` label of deepring_ring_dropped_frames_total).
MALFORMED = "malformed"  # not a message: bad msgpack, unknown type or version, bad field types
UNEXPECTED = "unexpected"  # a valid message of a type this socket does not take
BAD_IDENTITY = "bad_identity"  # a routing id or worker name that does not follow the scheme
UNKNOWN_PEER = "unknown_peer"  # tokens or stats from a peer that is not registered (any more)
BAD_REGISTRATION = "bad_registration"  # a `ready` whose info is missing, mistyped or absurd
IDENTITY_IN_USE = "identity_in_use"  # a `ready` for a worker id another live process holds
BAD_STATS = "bad_stats"
BAD_TOKENS = "bad_tokens"

_PRINTABLE = frozenset(range(0x21, 0x7F))


def printable(value: bytes | str, limit: int = 64) -> str:
    """`value` as safe log text: itself when it is printable ASCII of at most `limit` characters
    (no spaces or control characters), else `0x` and the hex of its first 16 bytes."""
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
    if raw and len(raw) <= limit and all(b in _PRINTABLE for b in raw):
        return raw.decode("ascii")
    more = "..." if len(raw) > 16 else ""
    return f"0x{raw[:16].hex()}{more} ({len(raw)} bytes)"


def printable_text(text: str, limit: int = 200) -> str:
    """A free-form message (an error's text, which may quote wire values) as one safe line:
    non-ASCII and control characters escaped, cut at `limit` characters."""
    safe = text.encode("ascii", "backslashreplace").decode("ascii")
    safe = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in safe)
    return safe if len(safe) <= limit else safe[:limit] + "..."


class DropLog:
    """Counts dropped messages by reason (into `counts`, which a metrics renderer may share) and
    logs each reason at most once per `interval` seconds."""

    def __init__(
        self,
        logger: logging.Logger,
        where: str,
        counts: dict[str, int] | None = None,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = logger
        self.where = where
        self.counts = counts if counts is not None else {}
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}  # reason -> when it was last logged
        self._since: dict[str, int] = {}  # reason -> drops since then

    def drop(self, reason: str, peer: bytes | str, detail: str) -> None:
        """Count one dropped message from `peer` (a routing id off the wire, or this process's
        own name for where it came from) and why."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self._since[reason] = self._since.get(reason, 0) + 1
        now = self._clock()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval:
            return
        n = self._since.pop(reason)
        self._last[reason] = now
        self.log.warning(
            "%s: dropped %d ring message%s (%s) since the last report; the latest from %s: %s",
            self.where,
            n,
            "" if n == 1 else "s",
            reason,
            printable(peer) if isinstance(peer, bytes) else printable_text(peer, 80),
            printable_text(detail),
        )

    @property
    def total(self) -> int:
        return sum(self.counts.values())
