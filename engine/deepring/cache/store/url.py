"""open_store: the block store a URL names."""

from __future__ import annotations

import urllib.parse
from typing import Any

from deepring.cache.store.base import BlockStore
from deepring.cache.store.directory import DirectoryStore

URL_FORMS = "redis://host:port[/db], rediss://host:port[/db], dir:///abs/path or a filesystem path"


def open_store(url: str, **kw: Any) -> BlockStore:
    """The store at `url`, with `kw` passed to its constructor (`clock`, `prefix`, ...):

    - `redis://host:port[/db]`, `rediss://...` (TLS): a RedisStore (connects on first use);
    - `dir:///abs/path`, `file:///abs/path` or a plain path (`~` expanded): a DirectoryStore.

    ValueError for anything else; StoreUnavailable when a directory cannot be created.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"empty store URL: use {URL_FORMS}")
    scheme, sep, _ = url.partition("://")
    if not sep:
        return DirectoryStore(url, **kw)
    scheme = scheme.lower()
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # parsed here so that a bad port is a ValueError now
    except ValueError as e:
        raise ValueError(f"bad store URL {url!r}: {e}") from e
    if scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise ValueError(f"bad store URL {url!r}: no host (redis://host:port[/db])")
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"bad store URL {url!r}: the database is a number, got {db!r}")
        del port
        # Imported here: a directory store needs no Redis client.
        from deepring.cache.store.redis import RedisStore

        return RedisStore(url, **kw)
    if scheme in ("dir", "file"):
        path = urllib.parse.unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise ValueError(
                f"bad store URL {url!r}: {scheme}:// takes an absolute path ({scheme}:///abs/path)"
            )
        return DirectoryStore(path, **kw)
    raise ValueError(f"unsupported store URL {url!r}: use {URL_FORMS}")
