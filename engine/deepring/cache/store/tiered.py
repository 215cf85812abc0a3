"""Several persistent tiers as one: the worker's directory store first (local or a shared
mount), then a shared Redis. Reads ask each tier in turn for what the earlier ones missed;
writes and deletes go to every tier. A block found only in a later tier is not copied back
into the earlier ones (its TTL there is unknown, and the next request that computes the
prefix writes it everywhere anyway)."""

from __future__ import annotations

from collections.abc import Sequence

from deepring.cache.store.base import BlockStore


class TieredStore:
    def __init__(self, stores: Sequence[BlockStore]) -> None:
        if not stores:
            raise ValueError("a tiered store needs at least one store")
        self.stores = list(stores)

    @property
    def url(self) -> str:
        return " + ".join(s.url for s in self.stores)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        for store in self.stores:
            if not todo:
                break
            got = store.get_many([keys[i] for i in todo])
            todo = [i for i, v in zip(todo, got, strict=True) if not _fill(out, i, v)]
        return out

    def put_many(self, items: list[tuple[bytes, bytes, float]]) -> int:
        """Writes to every tier; returns how many the first tier took."""
        counts = [s.put_many(items) for s in self.stores]
        return counts[0]

    def delete_many(self, keys: list[bytes]) -> int:
        return sum(s.delete_many(keys) for s in self.stores)

    def sweep(self) -> int:
        return sum(s.sweep() for s in self.stores)

    def stats(self) -> dict[str, int]:
        """Each tier's counters, prefixed with its kind (dir_hits, redis_errors, ...)."""
        return {f"{s.kind}_{k}": v for s in self.stores for k, v in s.stats().items()}

    def close(self) -> None:
        for s in self.stores:
            s.close()


def _fill(out: list[bytes | None], i: int, value: bytes | None) -> bool:
    if value is None:
        return False
    out[i] = value
    return True
