"""`deepring kv-store inspect | clear`: look into, and empty, a persistent tier of the prefix KV
cache (a directory or a Redis server, cache/store/).

Exit codes: 0 done, 1 the store cannot be reached or read (or clearing was declined), 2 a bad
URL or flag. Errors are one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deepring.cache.store import BlockStore

URL_HELP = "redis://host:port[/db], rediss://..., dir:///abs/path or a directory path"

# Remaining-TTL buckets of `inspect`: (label, upper bound in seconds, exclusive).
TTL_BUCKETS = [
    ("expired", 0.0),
    ("<1h", 3600.0),
    ("1h-1d", 86400.0),
    ("1d-3d", 3 * 86400.0),
    ("3d-7d", 7 * 86400.0),
    (">=7d", math.inf),
]


def _bucket(remaining_s: float) -> str:
    if remaining_s <= 0:
        return "expired"
    return next(
        label for label, upper in TTL_BUCKETS[1:] if remaining_s < upper or upper == math.inf
    )


def _size(n: float) -> str:
    unit = "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if n < 1024:
            break
        n, unit = n / 1024, bigger
    return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"


def _fail(message: str, code: int) -> int:
    print(f"deepring kv-store: {message}", file=sys.stderr)
    return code


def _with_store(args: argparse.Namespace, body: Callable[[BlockStore], int]) -> int:
    """Opens the store (never creating a directory) and runs body on it, turning a bad URL
    into exit code 2 and an unreachable store into 1."""
    from deepring.cache.store import StoreUnavailable, open_store

    is_redis = args.url.lower().startswith(("redis://", "rediss://"))
    kw: dict = {}
    if args.prefix is not None:
        if not is_redis:
            return _fail("--prefix applies to Redis stores only", 2)
        kw["prefix"] = args.prefix
    if not is_redis:
        kw["create"] = False
    try:
        store = open_store(args.url, **kw)
    except ValueError as e:
        return _fail(str(e), 2)
    except StoreUnavailable as e:
        return _fail(str(e), 1)
    try:
        return body(store)
    except StoreUnavailable as e:
        return _fail(f"cannot read the store: {e}", 1)
    finally:
        store.close()


def _inspect(args: argparse.Namespace) -> int:
    if args.list < 0:
        return _fail("--list takes a number >= 0", 2)

    def body(store: BlockStore) -> int:
        now = store.clock()
        entries = total = 0
        histogram = {label: 0 for label, _ in TTL_BUCKETS}
        listed = []
        for block in store.scan():
            entries += 1
            total += block.size
            remaining = block.expires_at - now
            histogram[_bucket(remaining)] += 1
            if len(listed) < args.list:
                listed.append((block.key.hex(), block.size, remaining))
        report = {
            "store": store.url,
            "kind": store.kind,
            "entries": entries,
            "bytes": total,
            "expired": histogram["expired"],
            "remaining_ttl": histogram,
        }
        if args.json:
            if args.list:
                report["listed"] = [
                    {"key": k, "bytes": n, "expires_in_s": r if math.isfinite(r) else None}
                    for k, n, r in listed
                ]
            print(json.dumps(report))
            return 0
        print(f"store          {store.url} ({store.kind})")
        print(f"entries        {entries:,} ({_size(total)})")
        print(f"expired        {histogram['expired']:,}")
        print("remaining TTL")
        for label, count in histogram.items():
            print(f"  {label:<12} {count:,}")
        for key, size, remaining in listed:
            if not math.isfinite(remaining):
                left = "no expiry"
            else:
                left = f"{remaining:,.0f} s left" if remaining > 0 else "expired"
            print(f"{key}  {_size(size):>12}  {left}")
        return 0

    return _with_store(args, body)


def _clear(args: argparse.Namespace) -> int:
    def body(store: BlockStore) -> int:
        if args.expired_only:
            if store.kind == "redis":
                print(f"nothing to remove from {store.url}: Redis expires entries itself")
                return 0
            before = store.stats()
            removed = store.sweep()
            after = store.stats()
            if after["errors"] > before["errors"]:
                return _fail(f"sweeping {store.url} failed part-way (removed {removed})", 1)
            expired = after["expired"] - before["expired"]
            damaged = after["corrupt"] - before["corrupt"]
            print(
                f"removed {removed:,} from {store.url}: {expired:,} expired, {damaged:,} damaged,"
                f" {removed - expired - damaged:,} abandoned temporary files"
            )
            return 0
        if not args.yes:
            entries = sum(1 for _ in store.scan())
            if entries == 0:
                print(f"{store.url} holds no entries")
                return 0
            try:
                answer = input(f"remove all {entries:,} entries of {store.url}? [y/N] ")
            except EOFError:
                answer = ""
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing removed")
                return 1
        removed = store.clear()
        print(f"removed {removed:,} entries from {store.url}")
        return 0

    return _with_store(args, body)


def add_kv_store_command(sub: argparse._SubParsersAction) -> None:
    """Adds `kv-store inspect` and `kv-store clear` to the `deepring` parser."""
    p = sub.add_parser("kv-store", help="inspect or clear a persistent prefix KV cache store")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("url", metavar="STORE_URL", help=URL_HELP)
        q.add_argument("--prefix", default=None, help="key prefix of a Redis store")

    q = actions.add_parser(
        "inspect", help="entries, bytes, expired entries and remaining TTLs of a store"
    )
    common(q)
    q.add_argument("--json", action="store_true", help="one JSON object")
    q.add_argument("--list", type=int, default=0, metavar="N", help="also list N entries")
    q.set_defaults(func=_inspect)

    q = actions.add_parser("clear", help="remove every entry of a store (or the expired ones)")
    common(q)
    q.add_argument(
        "--expired-only",
        action="store_true",
        help="remove only expired and damaged entries (a sweep); asks nothing",
    )
    q.add_argument("--yes", action="store_true", help="do not ask before removing everything")
    q.set_defaults(func=_clear)
