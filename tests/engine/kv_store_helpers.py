"""Shared pieces of the prefix KV cache store tests (test_kv_store*.py)."""

from __future__ import annotations

import hashlib


class FakeClock:
    """A store clock the test moves by hand: TTLs and backoffs without sleeping."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def key(i: int | str) -> bytes:
    """A 32-byte key, as the engine's hash chain makes them."""
    return hashlib.sha256(str(i).encode()).digest()


def value(i: int, size: int = 1000) -> bytes:
    """A value of `size` bytes that differs for each i."""
    seed = hashlib.sha256(f"value {i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]
