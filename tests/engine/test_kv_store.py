"""The directory store of the prefix KV cache (cache/store/): round trips, TTL and renewal on a
hit with a clock the tests move, sweeping, concurrent writers (threads and processes), opening a
store from its URL, the TTL policy and the background sweeper. Damage and failures:
test_kv_store_faults.py; Redis: test_kv_store_redis.py."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
from deepring.cache.store import (
    COUNTERS,
    BlockStore,
    DirectoryStore,
    StoredBlock,
    StoreUnavailable,
    Sweeper,
    open_store,
)
from deepring.cache.store.redis import RedisStore
from deepring.config import EngineSpec
from deepring.core.prefix import PrefixConfig
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_store_helpers import FakeClock, key, value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path, clock) -> DirectoryStore:
    return DirectoryStore(tmp_path / "store", clock=clock)


def _files(root: Path, pattern: str = "*.blk") -> list[Path]:
    return sorted(root.rglob(pattern))


# -- round trips -------------------------------------------------------------------------------

keys_st = st.binary(min_size=32, max_size=32)
batch_st = st.dictionaries(keys_st, st.binary(max_size=5000), max_size=24)


@settings(max_examples=40, deadline=None)
@given(batch=batch_st, absent=st.lists(keys_st, max_size=8), shuffle=st.randoms())
def test_round_trip_of_random_batches(batch, absent, shuffle):
    with tempfile.TemporaryDirectory() as d:
        store = DirectoryStore(d, clock=FakeClock())
        assert store.put_many([(k, v, 60.0) for k, v in batch.items()]) == len(batch)
        asked = list(batch) + [k for k in absent if k not in batch]
        shuffle.shuffle(asked)
        assert store.get_many(asked) == [batch.get(k) for k in asked]
        stats = store.stats()
        assert stats["hits"] == len(batch)
        assert stats["misses"] == len(asked) - len(batch)
        assert stats["bytes_written"] == stats["bytes_read"] == sum(map(len, batch.values()))
        assert not list(Path(d).rglob("*.tmp"))


def test_a_put_replaces_the_value_and_its_ttl(store, clock):
    store.put_many([(key(1), value(1), 10)])
    store.put_many([(key(1), value(2, 77), 100)])
    clock.advance(50)
    assert store.get_many([key(1)]) == [value(2, 77)]


def test_layout_is_one_sharded_file_per_block(store):
    store.put_many([(key(1), value(1), 10)])
    name = key(1).hex()
    assert _files(store.root) == [store.root / name[:2] / name[2:4] / f"{name}.blk"]
    assert store.path_of(key(1)).stat().st_size == 64 + 1000


def test_empty_batches_and_values(store):
    assert store.get_many([]) == []
    assert store.put_many([]) == 0
    assert store.delete_many([]) == 0
    assert store.put_many([(key(1), b"", 10)]) == 1
    assert store.get_many([key(1)]) == [b""]


def test_counters_are_the_documented_ones(store):
    assert set(store.stats()) == set(COUNTERS)
    assert all(v == 0 for v in store.stats().values())


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.get_many([b"short"]), ValueError),
        (lambda s: s.get_many(["x" * 32]), TypeError),
        (lambda s: s.put_many([(key(1), b"v", 0)]), ValueError),
        (lambda s: s.put_many([(key(1), b"v", float("inf"))]), ValueError),
        (lambda s: s.put_many([(key(1), b"v", -1)]), ValueError),
        (lambda s: s.put_many([(key(1), b"v", 1e300)]), ValueError),
        (lambda s: s.put_many([(key(1), b"v", float("nan"))]), ValueError),
        (lambda s: s.put_many([(key(1), "text", 10)]), TypeError),
        (lambda s: s.delete_many([key(1) + b"x"]), ValueError),
    ],
)
def test_bad_arguments_raise_and_write_nothing(store, call, error):
    with pytest.raises(error):
        call(store)
    assert not _files(store.root)
    assert store.stats()["errors"] == 0


def test_a_bad_item_anywhere_in_a_batch_writes_nothing(store):
    with pytest.raises(ValueError, match="TTL"):
        store.put_many([(key(1), b"a", 10), (key(2), b"b", 0)])
    assert not _files(store.root)


# -- TTL ---------------------------------------------------------------------------------------


def test_an_entry_expires_after_its_ttl(store, clock):
    store.put_many([(key(1), value(1), 10), (key(2), value(2), 100)])
    clock.advance(10)
    assert store.get_many([key(1), key(2)]) == [None, value(2)]
    assert store.stats()["expired"] == 1
    assert not store.path_of(key(1)).exists()  # removed by the read that found it expired


def test_a_hit_keeps_a_prefix_alive_for_another_full_ttl(store, clock):
    store.put_many([(key(1), value(1), 10), (key(2), value(2), 100)])
    for _ in range(5):  # 40 s in all: four times key 1's TTL, each step a hit
        clock.advance(8)
        assert store.get_many([key(1)]) == [value(1)]
    clock.advance(9.9)
    assert store.get_many([key(1)]) == [value(1)]
    # Renewed with its own TTL (10 s), not another entry's.
    clock.advance(10)
    assert store.get_many([key(1), key(2)]) == [None, value(2)]


def test_a_renewal_is_one_mtime_update_skipped_when_fresh(store, clock):
    store.put_many([(key(1), value(1), 10)])
    path = store.path_of(key(1))
    assert path.stat().st_mtime == pytest.approx(clock.now)
    data = path.read_bytes()
    clock.advance(0.5)  # within refresh_slack_s: no metadata write
    store.get_many([key(1)])
    assert path.stat().st_mtime == pytest.approx(clock.now - 0.5)
    clock.advance(5)
    store.get_many([key(1)])
    assert path.stat().st_mtime == pytest.approx(clock.now)
    assert path.read_bytes() == data  # the header is never rewritten


def test_scan_reports_sizes_and_expiry_times(store, clock):
    store.put_many([(key(1), value(1, 10), 10), (key(2), value(2, 20), 20)])
    start = clock.now
    clock.advance(15)
    found = sorted(store.scan(), key=lambda b: b.size)
    assert found == [
        StoredBlock(key(1), 10, pytest.approx(start + 10)),
        StoredBlock(key(2), 20, pytest.approx(start + 20)),
    ]
    assert store.stats()["gets"] == 0  # scanning is not reading: nothing renewed or counted


def test_sweep_removes_expired_entries_only(store, clock):
    store.put_many([(key(i), value(i), 10 * (i + 1)) for i in range(6)])
    clock.advance(35)  # keys 0, 1, 2 (TTL 10, 20, 30) have expired
    assert store.sweep() == 3
    assert store.stats()["expired"] == 3
    assert sorted(b.key for b in store.scan()) == sorted(key(i) for i in range(3, 6))
    assert store.sweep() == 0


def test_sweep_removes_stale_temporary_files_only(store, clock):
    store.put_many([(key(1), value(1), 1e6)])
    shard = store.path_of(key(1)).parent
    stale, fresh = shard / ".x.1.aa.tmp", shard / ".y.2.bb.tmp"
    for path, age in ((stale, 601), (fresh, 30)):
        path.write_bytes(b"half a block")
        os.utime(path, (clock.now - age, clock.now - age))
    other = shard / "notes.txt"  # not ours: left alone
    other.write_text("hello")
    assert store.sweep() == 1
    assert not stale.exists()
    assert fresh.exists()
    assert other.exists()
    assert store.get_many([key(1)]) == [value(1)]


def test_delete_and_clear(store):
    store.put_many([(key(i), value(i), 100) for i in range(5)])
    assert store.delete_many([key(0), key(1), key(99)]) == 2
    assert store.get_many([key(0), key(2)]) == [None, value(2)]
    assert store.clear() == 3
    assert store.stats()["deleted"] == 5
    assert not _files(store.root)
    assert list(store.scan()) == []


# -- concurrent writers ------------------------------------------------------------------------

WRITERS, ROUNDS, SHARED_KEYS = 4, 60, 6


def _writer_value(writer: int, k: int, r: int) -> bytes:
    # Each writer writes values of its own, of a length that varies, so a torn mix of two
    # writers' files would show.
    return value(writer * 1000 + k, 200 + 997 * ((writer + k + r) % 7))


def _all_writer_values(k: int) -> set[bytes]:
    return {_writer_value(w, k, r) for w in range(WRITERS) for r in range(ROUNDS)}


def _write_rounds(root: str, writer: int) -> None:
    store = DirectoryStore(root)
    for r in range(ROUNDS):
        for k in range(SHARED_KEYS):
            if store.put_many([(key(k), _writer_value(writer, k, r), 600)]) != 1:
                raise RuntimeError(f"writer {writer}: a put failed: {store.stats()}")


def _read_while(root: str, busy) -> list[tuple[int, bytes]]:
    store = DirectoryStore(root)
    seen = []
    while busy():
        for k, got in enumerate(store.get_many([key(k) for k in range(SHARED_KEYS)])):
            if got is not None:
                seen.append((k, got))
    return seen


def _check_concurrent_outcome(root: str, seen: list[tuple[int, bytes]]) -> None:
    valid = [_all_writer_values(k) for k in range(SHARED_KEYS)]
    assert seen, "the reader saw nothing"
    assert all(got in valid[k] for k, got in seen)
    store = DirectoryStore(root)
    final = store.get_many([key(k) for k in range(SHARED_KEYS)])
    assert all(got in valid[k] for k, got in enumerate(final))
    assert store.stats()["corrupt"] == 0
    assert not list(Path(root).rglob("*.tmp"))


def test_concurrent_writer_threads(tmp_path):
    threads = [
        threading.Thread(target=_write_rounds, args=(str(tmp_path), w)) for w in range(WRITERS)
    ]
    for t in threads:
        t.start()
    seen = _read_while(str(tmp_path), lambda: any(t.is_alive() for t in threads))
    for t in threads:
        t.join()
    _check_concurrent_outcome(str(tmp_path), seen)


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="needs fork (POSIX)"
)
def test_concurrent_writer_processes(tmp_path):
    # fork, not spawn: a child needs only this module's functions, and spawning would import
    # torch again in each of them.
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_rounds, args=(str(tmp_path), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    seen = _read_while(str(tmp_path), lambda: any(p.is_alive() for p in procs))
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    _check_concurrent_outcome(str(tmp_path), seen)


# -- opening, policy, sweeper ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:6390", RedisStore),
        ("redis://cache.example:6379/3", RedisStore),
        ("rediss://:pw@cache.example:6380/0", RedisStore),
        ("dir://{tmp}/a", DirectoryStore),
        ("file://{tmp}/b", DirectoryStore),
        ("DIR://localhost{tmp}/c", DirectoryStore),
        ("{tmp}/d", DirectoryStore),
    ],
)
def test_open_store_by_url(tmp_path, url, kind):
    store = open_store(url.format(tmp=tmp_path))
    assert isinstance(store, kind)
    assert isinstance(store, BlockStore)
    assert "pw" not in store.url
    assert "pw" not in repr(store)
    store.close()


def test_open_store_expands_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    store = open_store("~/kv")
    assert store.url == f"dir://{tmp_path}/kv"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty store URL"),
        ("s3://bucket/kv", "unsupported store URL"),
        ("http://h/x", "unsupported store URL"),
        ("dir://relative/path", "absolute path"),
        ("file://otherhost/x", "absolute path"),
        ("redis://", "no host"),
        ("redis://h:port", "bad store URL"),
        ("redis://h:6379/zero", "the database is a number"),
    ],
)
def test_open_store_refuses_other_urls(url, message):
    with pytest.raises(ValueError, match=message):
        open_store(url)


def test_a_root_that_cannot_be_created_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreUnavailable, match="cannot create the store directory"):
        DirectoryStore(tmp_path / "file" / "kv")
    with pytest.raises(StoreUnavailable, match="does not exist"):
        DirectoryStore(tmp_path / "missing", create=False)


def test_ttl_defaults_and_checks():
    # DeepSeek's figures: agent traffic 3 days, chat 7 days, ring snapshots minutes.
    assert (PrefixConfig().agent_ttl_s, PrefixConfig().chat_ttl_s) == (3 * 86400, 7 * 86400)
    assert PrefixConfig().ring_ttl_s == EngineSpec().swa_ttl_s == 180
    for name in ("agent_ttl_s", "chat_ttl_s", "ring_ttl_s"):
        for bad in (0, -1, float("nan")):
            with pytest.raises(ValueError, match=name):
                PrefixConfig(**{name: bad})


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_sweeper_sweeps_until_stopped(store, clock):
    store.put_many([(key(1), value(1), 10)])
    clock.advance(11)
    sweeper = Sweeper(store, interval_s=0.01).start()
    _wait_for(lambda: sweeper.removed == 1 and sweeper.runs >= 3)
    assert sweeper.stop(timeout_s=5)
    runs = sweeper.runs
    time.sleep(0.05)
    assert sweeper.runs == runs
    assert not _files(store.root)


class _BrokenSweep(DirectoryStore):
    def sweep(self) -> int:
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls <= 2:
            raise RuntimeError("a bug")
        return 1


def test_the_sweeper_survives_an_exception(tmp_path, caplog):
    with Sweeper(_BrokenSweep(tmp_path), interval_s=0.01) as sweeper:
        _wait_for(lambda: sweeper.runs >= 2)
    assert sweeper.failures == 2
    assert "sweep raised" in caplog.text


@pytest.mark.parametrize("interval", [0, -1, float("inf"), float("nan")])
def test_the_sweeper_needs_a_positive_interval(store, interval):
    with pytest.raises(ValueError, match="positive"):
        Sweeper(store, interval)
    assert Sweeper(store, 1).stop()  # never started: nothing to wait for
