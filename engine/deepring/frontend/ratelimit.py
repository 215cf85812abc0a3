"""Per-API-key rate limits on the generation routes: requests and tokens, as token buckets.

`--rate-limit-requests 60/min` gives each key a bucket of 60 requests that refills at one a
second: bursts up to the bucket, a steady rate of 60 a minute. `--rate-limit-tokens 100000/min`
does the same for tokens: a request needs its prompt's tokens in the bucket (or a full bucket,
for a prompt larger than the bucket) and takes them; its output tokens are taken as they are
generated, and may run the bucket into debt, which later requests wait out. A request over a
limit gets 429 with `Retry-After` (whole seconds until the bucket holds what it needs) in its
protocol's error shape; the key's other limit is not charged for it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from deepring.config import RateLimit
from deepring.frontend.metrics import Metrics
from deepring.frontend.requests import Sink
from deepring.protocol.errors import ApiError


class TokenBucket:
    def __init__(self, rate: RateLimit, now: float) -> None:
        self.capacity = rate.amount
        self.refill = rate.per_second
        self.level = rate.amount
        self.at = now

    def _update(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.refill)
            self.at = now

    def take(self, n: float, now: float) -> float:
        """Take n when the bucket holds them (a full bucket, for n above its capacity): 0.0.
        Otherwise take nothing and return the seconds until it will hold them."""
        self._update(now)
        need = min(n, self.capacity)
        if self.level >= need:
            self.level -= n
            return 0.0
        return (need - self.level) / self.refill

    def charge(self, n: float, now: float) -> None:
        """Take n whatever the level (tokens already generated): debt is allowed."""
        self._update(now)
        self.level -= n


class RateLimiter:
    """The buckets of every key that made a request (the configured keys bound them)."""

    def __init__(
        self,
        requests: RateLimit | None,
        tokens: RateLimit | None,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.requests = requests
        self.tokens = tokens
        self.metrics = metrics
        self.clock = clock
        self._request_buckets: dict[str, TokenBucket] = {}
        self._token_buckets: dict[str, TokenBucket] = {}

    @property
    def enabled(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def _bucket(self, table: dict[str, TokenBucket], rate: RateLimit, key: str) -> TokenBucket:
        b = table.get(key)
        if b is None:
            b = table[key] = TokenBucket(rate, self.clock())
        return b

    def _refuse(self, kind: str, rate: RateLimit, wait: float) -> ApiError:
        self.metrics.rate_limited[kind] = self.metrics.rate_limited.get(kind, 0) + 1
        retry = max(1, math.ceil(wait))
        return ApiError(
            429,
            f"rate limit exceeded: this API key may use {rate} {kind}; retry in {retry}s",
            headers=[("retry-after", str(retry))],
        )

    def admit_request(self, key: str | None) -> None:
        """Count one request of `key`; ApiError 429 when its request bucket is empty."""
        if key is None or self.requests is None:
            return
        wait = self._bucket(self._request_buckets, self.requests, key).take(1, self.clock())
        if wait > 0:
            raise self._refuse("requests", self.requests, wait)

    def admit_tokens(self, key: str | None, prompt_tokens: int) -> None:
        """Take a prompt's tokens from `key`'s token bucket; ApiError 429 when it is short."""
        if key is None or self.tokens is None:
            return
        bucket = self._bucket(self._token_buckets, self.tokens, key)
        wait = bucket.take(prompt_tokens, self.clock())
        if wait > 0:
            raise self._refuse("tokens", self.tokens, wait)

    def metered(self, key: str | None, sink: Sink) -> Sink:
        """`sink`, with the tokens it receives charged to `key` (when tokens are limited)."""
        if key is None or self.tokens is None:
            return sink
        return _MeteredSink(sink, self._bucket(self._token_buckets, self.tokens, key), self.clock)


class _MeteredSink:
    """A Sink that charges every generated token to a bucket, then passes it on."""

    def __init__(self, inner: Sink, bucket: TokenBucket, clock: Callable[[], float]) -> None:
        self.inner = inner
        self.bucket = bucket
        self.clock = clock

    def start(self, cache_hit: int) -> None:
        self.inner.start(cache_hit)

    def tokens(self, ids: list[int], finish: str | None, logprobs: list | None = None) -> bool:
        if ids:
            self.bucket.charge(len(ids), self.clock())
        return self.inner.tokens(ids, finish, logprobs)

    def error(self, message: str, status: int = 500) -> None:
        self.inner.error(message, status)
