"""A block store in Redis: one string per block, `<prefix><64 hex digits of the key>`, holding the
64-byte header of frame.py and the value, with the block's TTL as the key's expiry.

Reads are one MGET per batch. The TTL a hit renews is the one in the value's header, so it is
known only once the value has arrived: the renewals (PEXPIRE with that TTL, in one pipeline)
follow the read, a second round trip that happens only when something hit. A value that is not
a valid block of its key (another program's, another format version, damaged) is a miss,
counted in `corrupt`, and deleted. Writes are one pipeline of `SET name value PX ttl` per batch.

Redis expires keys itself, so `sweep` has nothing to do. `scan` and `clear` walk the prefix with
SCAN (never KEYS) and touch no other key, so several caches, or other data, can share a server
under different prefixes. The server's clock decides expiry; the store's `clock` only places
the expiry times `scan` reports and drives the backoff.

A dead server must cost little: short socket timeouts, no retries inside redis-py (the backoff of
base.py decides when to try again). Redis Cluster is not supported (MGET spans hash slots).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from deepring.cache.store.base import BlockStore, StoredBlock
from deepring.cache.store.frame import (
    HEADER_BYTES,
    KEY_BYTES,
    FrameError,
    pack_header,
    parse_header,
    unframe,
)

DEFAULT_PREFIX = "deepring:kv:"
_SCAN_BATCH = 500


def _batches(items: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _glob_escape(text: bytes) -> bytes:
    """text as a literal in a SCAN MATCH pattern."""
    out = bytearray()
    for byte in text:
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)


def redact(url: str) -> str:
    """url with its password replaced by ***, for logs and messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class RedisStore(BlockStore):
    """Blocks in the Redis server at `url` (`redis://host:port[/db]`, `rediss://` for TLS),
    under `prefix`. Connects on first use, not here."""

    kind = "redis"
    failures = (OSError, RedisError)

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] = time.time,
        socket_timeout: float = 1.0,
        connect_timeout: float = 0.5,
        **backoff: float,
    ) -> None:
        super().__init__(clock=clock, **backoff)
        if not prefix:
            raise ValueError("a Redis store needs a non-empty key prefix")
        self.prefix = prefix
        self._prefix = prefix.encode()
        self._url = redact(url)
        # decode_responses is forced off: values are bytes, whatever the URL's query says.
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
        )

    @property
    def url(self) -> str:
        return self._url

    def name_of(self, key: bytes) -> bytes:
        """The Redis key that holds `key`'s block."""
        return self._prefix + key.hex().encode()

    def _key_of(self, name: bytes) -> bytes | None:
        digits = name[len(self._prefix) :]
        if len(digits) != 2 * KEY_BYTES:
            return None
        try:
            return bytes.fromhex(digits.decode("ascii"))
        except ValueError:
            return None

    def close(self) -> None:
        self._client.close()

    # -- hooks -----------------------------------------------------------------------------

    def _get(self, keys: list[bytes], now: float) -> Iterator[bytes | None]:
        names = [self.name_of(k) for k in keys]
        values: list[bytes | None] = []
        renew: list[tuple[bytes, int]] = []
        damaged: list[bytes] = []
        for key, name, raw in zip(keys, names, self._client.mget(names), strict=True):
            if raw is None:
                values.append(None)
                continue
            try:
                header, value = unframe(raw, key)
            except FrameError:
                damaged.append(name)
                values.append(None)
                continue
            renew.append((name, header.ttl_ms))
            values.append(value)
        if damaged:
            self._count(corrupt=len(damaged))
        # The values go first: if the renewals below fail, the hits still count (the failure
        # is counted and starts a backoff, as any other).
        yield from values
        if renew or damaged:
            pipe = self._client.pipeline(transaction=False)
            for name, ttl_ms in renew:
                pipe.pexpire(name, ttl_ms)
            if damaged:
                pipe.unlink(*damaged)
            pipe.execute()

    def _put(self, items: list[tuple[bytes, bytes, int]], now: float) -> Iterator[bool]:
        pipe = self._client.pipeline(transaction=False)
        for key, value, ttl_ms in items:
            pipe.set(self.name_of(key), pack_header(key, ttl_ms, value) + value, px=ttl_ms)
        results = pipe.execute(raise_on_error=False)
        errors = [r for r in results if isinstance(r, Exception)]
        for result in results:
            yield result is True
        if errors:  # e.g. the server is out of memory (maxmemory with noeviction)
            raise errors[0]

    def _delete(self, keys: list[bytes]) -> Iterator[bool]:
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.unlink(self.name_of(key))
        for removed in pipe.execute():
            yield removed == 1

    def _sweep(self, now: float) -> Iterator[int]:
        yield from ()  # Redis removes expired keys itself

    def _scan(self, now: float) -> Iterator[StoredBlock]:
        names = self._client.scan_iter(match=_glob_escape(self._prefix) + b"*", count=1000)
        for batch in _batches(names, _SCAN_BATCH):
            pipe = self._client.pipeline(transaction=False)
            for name in batch:
                pipe.getrange(name, 0, HEADER_BYTES - 1)
                pipe.pttl(name)
            replies = pipe.execute()
            for name, head, pttl in zip(batch, replies[::2], replies[1::2], strict=True):
                key = self._key_of(name)
                if key is None or pttl == -2:  # not a block's name, or gone meanwhile
                    continue
                try:
                    header = parse_header(head, key)
                except FrameError:
                    continue
                expires_at = float("inf") if pttl < 0 else now + pttl / 1000
                yield StoredBlock(key, header.length, expires_at)

    def _clear(self) -> int:
        removed = 0
        names = self._client.scan_iter(match=_glob_escape(self._prefix) + b"*", count=1000)
        for batch in _batches(names, _SCAN_BATCH):
            removed += self._client.unlink(*batch)
        return removed
