"""A block store in a directory: a local disk, or a POSIX mount many machines share (NFS, 3FS,
Lustre), which makes it one cache for all of them.

Layout: one file per block, `root/ab/cd/<64 hex digits of the key>.blk`, where `ab` and `cd`
are the key's first two bytes (65,536 leaf directories keep each one small). A file is the
64-byte header of frame.py followed by the value, so a file renamed onto another key's name, a
truncated one, a flipped bit, another format version or a foreign file is noticed, counted in
`corrupt`, removed, and read as a miss.

Expiry lives in the file's mtime: an entry expires at mtime + its TTL (from the header). A write
sets the mtime to the store's clock; a hit renews the entry by setting it again (`os.utime`, one
metadata call, skipped when the mtime is less than `refresh_slack_s` old), so renewing never
rewrites any data and a reader never sees a half-updated header. On a shared mount the times
are the writers' clocks, so the machines' clocks must agree (NTP) to well within a TTL. Setting
an explicit mtime needs the file's owner: the machines sharing a root run as one user. A renewal
that fails (a read-only mount, another owner) still returns the hit.

Writes are atomic: the block goes to a temporary file with a unique name in its final directory,
which is then renamed over the block's name (`os.replace`). Two writers of one key, in threads,
processes or on other machines, each rename a complete file; the last rename wins and a reader
sees one whole file or the other. No fsync by default: after a crash a block may be lost or cut
short, and the crc turns that into a miss, which costs a recomputation, not a wrong answer;
`fsync=True` syncs each file and its directory before returning.

A read that finds an entry expired or damaged removes it only if the name still holds the file
it read (same inode): a fresh block another writer just renamed into place is left alone.
`sweep` walks the tree, removes expired and damaged blocks and temporary files older than
`temp_max_age_s` (left by a writer that died), and counts each in `expired` or `corrupt`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from deepring.cache.store.base import BlockStore, StoredBlock, StoreUnavailable, log
from deepring.cache.store.frame import (
    HEADER_BYTES,
    KEY_BYTES,
    FrameError,
    Header,
    check_value,
    pack_header,
    parse_header,
)

BLOCK_SUFFIX = ".blk"
TEMP_SUFFIX = ".tmp"
_HEX = frozenset("0123456789abcdef")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Reads open with O_NONBLOCK so that a FIFO someone left at a block's name cannot hang them (it
# changes nothing for regular files).
_O_READ = os.O_RDONLY | _O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
_UTIME_FD = os.utime in os.supports_fd


def _read_exact(fd: int, n: int) -> bytes:
    """Up to n bytes from fd: fewer only at the end of the file."""
    first = os.read(fd, n)
    if len(first) == n or not first:
        return first
    parts, got = [first], len(first)
    while got < n:
        part = os.read(fd, n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _write_all(fd: int, *chunks: bytes) -> None:
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]


def _is_hex(name: str, length: int) -> bool:
    return len(name) == length and set(name) <= _HEX


class DirectoryStore(BlockStore):
    """Blocks as files under `root` (created when missing, unless `create=False`)."""

    kind = "directory"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        create: bool = True,
        fsync: bool = False,
        refresh_slack_s: float = 1.0,
        temp_max_age_s: float = 600.0,
        **backoff: float,
    ) -> None:
        super().__init__(clock=clock, **backoff)
        self.root = Path(root).expanduser().absolute()
        self.fsync = fsync
        self.refresh_slack_s = refresh_slack_s
        self.temp_max_age_s = temp_max_age_s
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreUnavailable(
                    f"cannot create the store directory {self.root}: {e.strerror or e}"
                ) from e
        if not self.root.is_dir():
            what = "is not a directory" if self.root.exists() else "does not exist"
            raise StoreUnavailable(f"the store directory {self.root} {what}")

    @property
    def url(self) -> str:
        return f"dir://{self.root}"

    def path_of(self, key: bytes) -> Path:
        """The file that holds `key`'s block."""
        name = key.hex()
        return self.root / name[:2] / name[2:4] / (name + BLOCK_SUFFIX)

    # -- hooks -----------------------------------------------------------------------------

    def _get(self, keys: list[bytes], now: float) -> Iterator[bytes | None]:
        for key in keys:
            yield self._read(key, now)

    def _put(self, items: list[tuple[bytes, bytes, int]], now: float) -> Iterator[bool]:
        for key, value, ttl_ms in items:
            self._write(key, value, ttl_ms, now)
            yield True

    def _delete(self, keys: list[bytes]) -> Iterator[bool]:
        for key in keys:
            try:
                os.unlink(self.path_of(key))
            except (FileNotFoundError, IsADirectoryError):  # a directory: not a block
                yield False
            else:
                yield True

    def _sweep(self, now: float) -> Iterator[int]:
        for entry in self._walk():
            name = entry.name
            if name.endswith(BLOCK_SUFFIX):
                yield self._sweep_block(entry.path, name, now)
            elif name.startswith(".") and name.endswith(TEMP_SUFFIX):
                yield self._remove_stale_temp(entry.path, now)

    def _scan(self, now: float) -> Iterator[StoredBlock]:
        for entry in self._walk():
            key = self._key_of(entry.name)
            if key is None:
                continue
            try:
                found = self._open_header(entry.path, key)
            except FileNotFoundError:
                continue
            if found is not None and not isinstance(found[1], FrameError):
                st, header = found
                yield StoredBlock(key, header.length, st.st_mtime + header.ttl_ms / 1000)

    def _clear(self) -> int:
        removed = 0
        now = self.clock()
        for entry in self._walk():
            name = entry.name
            if name.endswith(BLOCK_SUFFIX) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
            elif name.startswith(".") and name.endswith(TEMP_SUFFIX):
                self._remove_stale_temp(entry.path, now)
        return removed

    # -- reading ---------------------------------------------------------------------------

    def _read(self, key: bytes, now: float) -> bytes | None:
        path = self.path_of(key)
        try:
            fd = os.open(path, _O_READ)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                # A directory or device at a block's name: nothing we can read or remove.
                self._count(corrupt=1)
                return None
            try:
                header = parse_header(_read_exact(fd, HEADER_BYTES), key)
                if st.st_size != HEADER_BYTES + header.length:
                    want = HEADER_BYTES + header.length
                    raise FrameError(f"file of {st.st_size} bytes, the header says {want}")
                if now >= st.st_mtime + header.ttl_ms / 1000:
                    self._count(expired=1)
                    self._remove_if_same(path, st, strict=False)
                    return None
                value = _read_exact(fd, header.length)
                check_value(header, value)
            except FrameError as e:
                log.debug("kv store %s: %s is damaged: %s", self.url, path, e)
                self._count(corrupt=1)
                self._remove_if_same(path, st, strict=False)
                return None
            if now - st.st_mtime > self.refresh_slack_s:
                self._renew(fd, path, now)
            return value
        finally:
            os.close(fd)

    def _renew(self, fd: int, path: Path, now: float) -> None:
        try:
            os.utime(fd if _UTIME_FD else path, times=(now, now))
        except OSError as e:
            log.debug("kv store %s: cannot renew %s: %s", self.url, path, e)

    def _open_header(
        self, path: str, key: bytes
    ) -> tuple[os.stat_result, Header | FrameError] | None:
        """The stat and header (or why it is not one) of the file at path; None when the name
        holds no regular file. FileNotFoundError when it is gone."""
        fd = os.open(path, _O_READ)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            try:
                header = parse_header(_read_exact(fd, HEADER_BYTES), key)
            except FrameError as e:
                return st, e
            if st.st_size != HEADER_BYTES + header.length:
                return st, FrameError("file size does not match the header")
            return st, header
        finally:
            os.close(fd)

    def _remove_if_same(self, path: str | Path, st: os.stat_result, *, strict: bool) -> bool:
        """Unlinks path if it still is the file `st` describes. Failures other than the file
        being gone raise when `strict`, and are logged otherwise (a read that found a stale
        entry returns its miss either way)."""
        try:
            now_there = os.stat(path)
            if (now_there.st_dev, now_there.st_ino) != (st.st_dev, st.st_ino):
                return False
            os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as e:
            if strict:
                raise
            log.debug("kv store %s: cannot remove %s: %s", self.url, path, e)
            return False
        return True

    # -- writing ---------------------------------------------------------------------------

    def _write(self, key: bytes, value: bytes, ttl_ms: int, now: float) -> None:
        path = self.path_of(key)
        header = pack_header(key, ttl_ms, value)
        fd, tmp = self._create_temp(path)
        try:
            try:
                _write_all(fd, header, value)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            # The expiry clock starts after close: an NFS client sends the data at close, and
            # the server would stamp that moment on the file.
            os.utime(tmp, times=(now, now))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if self.fsync:
            self._fsync_dir(path.parent)

    def _create_temp(self, path: Path) -> tuple[int, Path]:
        """A new, empty temporary file beside path, with a name no other writer (thread,
        process or machine) can have: pid plus random bits, and O_EXCL to make sure."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC
        for _ in range(3):
            tmp = path.parent / f".{path.stem}.{os.getpid()}.{secrets.token_hex(6)}{TEMP_SUFFIX}"
            try:
                return os.open(tmp, flags, 0o666), tmp
            except FileNotFoundError:
                # The shard directory (or the whole root, if someone removed it) is missing.
                path.parent.mkdir(parents=True, exist_ok=True)
            except FileExistsError:
                continue
        raise OSError(errno.EEXIST, "no free temporary file name", str(path.parent))

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | _O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- the tree --------------------------------------------------------------------------

    def _walk(self) -> Iterator[os.DirEntry[str]]:
        """Every entry of every shard directory. Other directories (a mount's `.snapshot`,
        `lost+found`) are not ours and are not entered."""
        for top in _scandir(self.root):
            if not (_is_hex(top.name, 2) and top.is_dir(follow_symlinks=False)):
                continue
            for leaf in _scandir(top.path):
                if _is_hex(leaf.name, 2) and leaf.is_dir(follow_symlinks=False):
                    yield from _scandir(leaf.path)

    @staticmethod
    def _key_of(name: str) -> bytes | None:
        stem = name.removesuffix(BLOCK_SUFFIX)
        if stem == name or not _is_hex(stem, 2 * KEY_BYTES):
            return None
        return bytes.fromhex(stem)

    def _sweep_block(self, path: str, name: str, now: float) -> int:
        key = self._key_of(name)
        try:
            if key is None:  # our suffix, not a key's name: nothing reads it
                st = os.stat(path)
                if not stat.S_ISREG(st.st_mode):
                    return 0
                verdict: Header | FrameError = FrameError("not a key's file name")
            else:
                found = self._open_header(path, key)
                if found is None:
                    return 0
                st, verdict = found
        except FileNotFoundError:
            return 0
        if isinstance(verdict, FrameError):
            self._count(corrupt=1)
        elif now >= st.st_mtime + verdict.ttl_ms / 1000:
            self._count(expired=1)
        else:
            return 0
        return int(self._remove_if_same(path, st, strict=True))

    def _remove_stale_temp(self, path: str, now: float) -> int:
        try:
            if now - os.stat(path).st_mtime <= self.temp_max_age_s:
                return 0
            os.unlink(path)
        except FileNotFoundError:
            return 0
        return 1


def _scandir(path: str | Path) -> Iterator[os.DirEntry[str]]:
    """The entries of a directory; none when it is gone (removed by a concurrent clear)."""
    try:
        with os.scandir(path) as it:
            yield from it
    except FileNotFoundError:
        return
