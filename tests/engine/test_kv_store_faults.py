"""The directory store facing damage and failure: every damaged file is a miss, counted and
removed, never returned; a failing disk (full, permission denied, I/O errors, simulated beside
the real store) degrades to misses and unwritten blocks without raising, with a backoff and
rate-limited warnings."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import struct
import zlib

import pytest
from deepring.cache.store import DirectoryStore
from deepring.cache.store import directory as directory_module
from deepring.cache.store.frame import HEADER_BYTES
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_store_helpers import FakeClock, key, value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path, clock) -> DirectoryStore:
    return DirectoryStore(tmp_path / "store", clock=clock)


def _expect_corrupt_miss(store: DirectoryStore, k: bytes, *, removed: bool = True) -> None:
    assert store.get_many([k]) == [None]
    stats = store.stats()
    assert stats["corrupt"] == 1
    assert stats["errors"] == 0
    assert store.path_of(k).exists() is not removed


def _rewrite_header(data: bytes, **fields: int | bytes) -> bytes:
    """data with header fields replaced and the header crc made valid again (a well-formed
    header that still must be refused)."""
    layout = struct.Struct("<4sHH32sQQI")
    magic, version, reserved, k, ttl_ms, length, crc = layout.unpack_from(data)
    values = {"magic": magic, "version": version, "key": k}
    values.update(fields)
    body = layout.pack(
        values["magic"], values["version"], reserved, values["key"], ttl_ms, length, crc
    )
    return body + struct.pack("<I", zlib.crc32(body)) + data[HEADER_BYTES:]


# -- damaged files -----------------------------------------------------------------------------

DAMAGE = {
    "truncated value": lambda data: data[: HEADER_BYTES + 500],
    "truncated header": lambda data: data[:20],
    "empty file": lambda data: b"",
    "trailing bytes": lambda data: data + b"\0",
    "flipped value byte": lambda data: data[:700] + bytes([data[700] ^ 0x01]) + data[701:],
    "last value byte": lambda data: data[:-1] + bytes([data[-1] ^ 0x80]),
    "wrong version": lambda data: _rewrite_header(data, version=2),
    "wrong magic": lambda data: _rewrite_header(data, magic=b"NOPE"),
    "another key": lambda data: _rewrite_header(data, key=key("other")),
    "not a block": lambda data: b"#!/bin/sh\necho this is not a block\n" * 10,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_file_is_a_counted_miss_and_removed(store, damage):
    store.put_many([(key(1), value(1), 100), (key(2), value(2), 100)])
    path = store.path_of(key(1))
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    _expect_corrupt_miss(store, key(1))
    assert store.get_many([key(2)]) == [value(2)]  # the neighbour is untouched


@pytest.mark.parametrize("offset", range(HEADER_BYTES))
def test_any_flipped_header_byte_is_caught(store, offset):
    store.put_many([(key(1), value(1), 100)])
    path = store.path_of(key(1))
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(data)
    _expect_corrupt_miss(store, key(1))


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 3000), where=st.integers(0, 10**6), flip=st.integers(1, 255))
def test_no_flipped_byte_anywhere_is_ever_returned(tmp_path_factory, size, where, flip):
    store = DirectoryStore(tmp_path_factory.mktemp("flip"), clock=FakeClock())
    store.put_many([(key(1), value(1, size), 100)])
    path = store.path_of(key(1))
    data = bytearray(path.read_bytes())
    data[where % len(data)] ^= flip
    path.write_bytes(data)
    assert store.get_many([key(1)]) == [None]
    assert store.stats()["corrupt"] == 1


def test_a_file_renamed_onto_another_keys_name_is_refused(store):
    store.put_many([(key(1), value(1), 100)])
    target = store.path_of(key(2))
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(store.path_of(key(1)), target)
    _expect_corrupt_miss(store, key(2))
    assert store.get_many([key(1)]) == [value(1)]


def test_a_directory_at_a_blocks_name_is_a_miss(store):
    store.path_of(key(1)).mkdir(parents=True)
    _expect_corrupt_miss(store, key(1), removed=False)
    assert store.put_many([(key(2), value(2), 100)]) == 1  # the store still works


def test_sweep_removes_damaged_files_and_badly_named_ones(store):
    store.put_many([(key(i), value(i), 100) for i in range(3)])
    store.path_of(key(0)).write_bytes(b"junk")
    odd = store.path_of(key(1)).parent / "zz.blk"  # our suffix, not a key's name
    odd.write_bytes(b"junk")
    (odd.parent / "dir.blk").mkdir()  # not a file at all: left alone, and no failure
    store.path_of(key(3)).parent.mkdir(parents=True, exist_ok=True)
    store.path_of(key(3)).mkdir()
    assert store.sweep() == 2
    assert store.stats()["corrupt"] == 2
    assert not odd.exists()
    assert store.get_many([key(1), key(2)]) == [value(1), value(2)]
    assert store.delete_many([key(3)]) == 0
    assert store.clear() == 2  # keys 1 and 2; the directories stay
    assert store.stats()["errors"] == 0


def test_scan_skips_damaged_files(store):
    store.put_many([(key(i), value(i), 100) for i in range(3)])
    store.path_of(key(0)).write_bytes(b"junk")
    assert sorted(b.key for b in store.scan()) == sorted([key(1), key(2)])


def test_a_crash_between_write_and_rename_leaves_only_a_temp_file(store, clock, monkeypatch):
    """A writer that died before its rename leaves a temporary file nobody reads, which the
    sweep removes once it is old."""
    eio = OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(directory_module, "os", _FailingOs(replace=eio, unlink=eio))
    assert store.put_many([(key(1), value(1), 100)]) == 0
    monkeypatch.undo()
    temps = list(store.root.rglob("*.tmp"))
    assert len(temps) == 1
    assert store.get_many([key(1)]) == [None]
    clock.advance(601)
    assert store.sweep() == 1
    assert not list(store.root.rglob("*.tmp"))


# -- a failing disk ----------------------------------------------------------------------------


class _FailingOs:
    """Stands in for the `os` module inside directory.py: the named functions raise, the rest
    are the real ones. The store is real; only its system calls fail."""

    def __init__(self, **failures: OSError) -> None:
        self.failures = failures
        self.calls = dict.fromkeys(failures, 0)

    def __getattr__(self, name: str):
        if name not in self.failures:
            return getattr(os, name)

        def failing(*args, **kw):
            self.calls[name] += 1
            raise self.failures[name]

        return failing


FAILURES = {
    "disk full on write": ("write", OSError(errno.ENOSPC, "No space left on device")),
    "permission denied on create": ("open", PermissionError(errno.EACCES, "Permission denied")),
    "rename fails": ("replace", OSError(errno.EIO, "Input/output error")),
    "stale NFS handle": ("fstat", OSError(errno.ESTALE, "Stale file handle")),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failing_disk_degrades_without_raising(store, clock, monkeypatch, caplog, failure):
    store.put_many([(key(1), value(1), 100)])
    name, exc = FAILURES[failure]
    fake = _FailingOs(**{name: exc})
    monkeypatch.setattr(directory_module, "os", fake)
    caplog.set_level(logging.WARNING, logger="deepring.cache")

    written = store.put_many([(key(2), value(2), 100), (key(3), value(3), 100)])
    clock.advance(1)  # past the first backoff
    got = store.get_many([key(1), key(2)])

    assert store.stats()["errors"] >= 1
    assert caplog.records
    assert caplog.records[0].levelname == "WARNING"
    assert store.url in caplog.text
    if name == "fstat":  # a read-side failure: writes still work
        assert written == 2
        assert got == [None, None]
    else:
        assert written == 0
        assert got[1] is None
    monkeypatch.undo()
    assert not list(store.root.rglob("*.tmp"))  # a failed write removes its temporary file
    clock.advance(60)
    assert store.put_many([(key(4), value(4), 100)]) == 1
    assert store.get_many([key(4)]) == [value(4)]


def test_a_failure_part_way_keeps_what_was_done(store, clock, monkeypatch):
    real_replace = os.replace
    calls = []

    def replace_twice(src, dst):
        calls.append(dst)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(directory_module, "os", _Overlay(replace=replace_twice))
    assert store.put_many([(key(i), value(i), 100) for i in range(5)]) == 2
    monkeypatch.undo()
    clock.advance(1)  # past the backoff the failure started
    assert store.get_many([key(0), key(1), key(2)]) == [value(0), value(1), None]
    assert store.stats()["puts"] == 2


class _Overlay:
    def __init__(self, **functions) -> None:
        self.functions = functions

    def __getattr__(self, name: str):
        return self.functions.get(name) or getattr(os, name)


def test_backoff_skips_the_disk_and_grows(store, clock, monkeypatch, caplog):
    fake = _FailingOs(open=OSError(errno.EIO, "Input/output error"))
    monkeypatch.setattr(directory_module, "os", fake)

    def attempts_after(step: float) -> int:
        before = fake.calls["open"]
        clock.advance(step)
        store.get_many([key(1)])
        return fake.calls["open"] - before

    assert attempts_after(0) == 1  # fails: 0.5 s pause
    assert attempts_after(0.4) == 0  # skipped: no system call at all
    assert attempts_after(0.2) == 1  # fails again: 1 s pause
    assert attempts_after(0.9) == 0
    assert attempts_after(0.2) == 1  # 2 s pause
    assert attempts_after(1.9) == 0
    for _ in range(10):  # the pause stops growing at 30 s
        attempts_after(31)
    assert attempts_after(29.9) == 0
    assert attempts_after(0.2) == 1
    assert store.stats()["errors"] == 14
    # Skipped calls are misses, not errors; the warnings are rate-limited.
    assert store.stats()["misses"] == 18
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) < 14

    monkeypatch.undo()
    caplog.clear()
    caplog.set_level(logging.INFO, logger="deepring.cache")
    clock.advance(31)
    assert store.put_many([(key(1), value(1), 100)]) == 1
    assert "working again after 14 failed calls" in caplog.text
    assert store.get_many([key(1)]) == [value(1)]


def test_warnings_are_at_most_one_per_ten_seconds(tmp_path, clock, monkeypatch, caplog):
    # No backoff, so that every call is tried and fails.
    store = DirectoryStore(tmp_path, clock=clock, backoff_s=0, max_backoff_s=0)
    monkeypatch.setattr(directory_module, "os", _FailingOs(open=OSError(errno.EIO, "EIO")))
    caplog.set_level(logging.WARNING, logger="deepring.cache")
    for _ in range(40):  # a failure every 0.6 s, 24 s in all
        store.get_many([key(1)])
        clock.advance(0.6)
    warnings = [r.getMessage() for r in caplog.records]
    assert store.stats()["errors"] == 40
    assert len(warnings) == 3
    assert "more failures since the last warning" in warnings[1]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_read_only_directory_is_not_fatal(store):
    store.put_many([(key(1), value(1), 100)])
    shard = store.path_of(key(2)).parent
    shard.mkdir(parents=True, exist_ok=True)
    shard.chmod(0o500)
    try:
        assert store.put_many([(key(2), value(2), 100)]) == 0
        assert store.stats()["errors"] == 1
    finally:
        shard.chmod(0o700)
