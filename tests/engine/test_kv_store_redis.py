"""The Redis store of the prefix KV cache against a real redis-server the tests start: round
trips, TTLs as the server sees them, renewal on a hit, prefixes kept apart, foreign and damaged
values, a server killed mid-run and restarted, and the kv-store CLI on Redis."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest
import redis
from deepring import cli
from deepring.cache.store import open_store
from deepring.cache.store.frame import HEADER_BYTES
from deepring.cache.store.redis import RedisStore, redact
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_store_helpers import RedisServer, key, value


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture
def client(server):
    c = redis.Redis.from_url(server.url)
    c.flushdb()
    yield c
    c.close()


@pytest.fixture
def store(server, client):
    s = open_store(server.url)
    yield s
    s.close()


@settings(max_examples=25, deadline=None)
@given(batch=st.dictionaries(st.binary(min_size=32, max_size=32), st.binary(max_size=5000)))
def test_round_trip_of_random_batches(server, batch):
    with RedisStore(server.url, prefix="rt:") as store:
        store.clear()
        assert store.put_many([(k, v, 60) for k, v in batch.items()]) == len(batch)
        absent = key("absent")
        asked = [*batch, absent] if absent not in batch else list(batch)
        assert store.get_many(asked) == [batch.get(k) for k in asked]
        assert store.stats()["hits"] == len(batch)


def test_keys_are_prefixed_hex_and_ttls_are_set(store, client):
    store.put_many([(key(1), value(1), 100), (key(2), value(2), 3600.5)])
    name = b"deepring:kv:" + key(1).hex().encode()
    assert client.exists(name)
    assert client.strlen(name) == HEADER_BYTES + 1000
    assert 99 <= client.ttl(name) <= 100
    assert 3_600_000 <= client.pttl(store.name_of(key(2))) <= 3_600_500


def test_a_hit_renews_the_ttl_it_was_stored_with(store, client):
    store.put_many([(key(1), value(1), 100), (key(2), value(2), 1000)])
    for k in (key(1), key(2)):
        client.pexpire(store.name_of(k), 5000)  # as if most of the TTL had passed
    assert store.get_many([key(1), key(2)]) == [value(1), value(2)]
    assert 99_000 <= client.pttl(store.name_of(key(1))) <= 100_000
    assert 999_000 <= client.pttl(store.name_of(key(2))) <= 1_000_000


def test_an_entry_expires_on_the_server(store, client):
    store.put_many([(key(1), value(1), 0.05)])
    time.sleep(0.1)
    assert store.get_many([key(1)]) == [None]
    assert store.sweep() == 0  # Redis expires keys itself


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: b"a value some other program wrote",
        lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]),
        lambda raw: raw[:HEADER_BYTES],
        lambda raw: raw[:10] + bytes([raw[10] ^ 1]) + raw[11:],  # the key in the header
    ],
)
def test_a_foreign_or_damaged_value_is_a_miss_and_removed(store, client, damage):
    store.put_many([(key(1), value(1), 100)])
    name = store.name_of(key(1))
    client.set(name, damage(client.get(name)))
    assert store.get_many([key(1)]) == [None]
    assert store.stats()["corrupt"] == 1
    assert not client.exists(name)


def test_a_value_copied_under_another_keys_name_is_refused(store, client):
    store.put_many([(key(1), value(1), 100)])
    client.copy(store.name_of(key(1)), store.name_of(key(2)))
    assert store.get_many([key(2), key(1)]) == [None, value(1)]


def test_prefixes_keep_stores_apart(server, client):
    a, b = RedisStore(server.url, prefix="a:"), RedisStore(server.url, prefix="b*[x]:")
    client.set("someone-elses-key", "keep me")
    a.put_many([(key(i), value(i), 100) for i in range(3)])
    b.put_many([(key(i), value(i + 10), 100) for i in range(2)])
    assert b.get_many([key(0)]) == [value(10)]
    assert len(list(a.scan())) == 3
    assert len(list(b.scan())) == 2  # the glob characters of the prefix are literal
    assert a.clear() == 3
    assert a.get_many([key(0)]) == [None]
    assert b.get_many([key(0), key(1)]) == [value(10), value(11)]
    assert client.get("someone-elses-key") == b"keep me"
    assert a.stats()["deleted"] == 3


def test_scan_and_delete(store, client):
    store.put_many([(key(1), value(1, 10), 100), (key(2), value(2, 20), 200)])
    client.set(store.prefix + "not-a-key", "x")  # under the prefix, not a block: skipped
    client.persist(store.name_of(key(2)))
    now = time.time()
    found = {b.key: b for b in store.scan()}
    assert set(found) == {key(1), key(2)}
    assert found[key(1)].size == 10
    assert found[key(1)].expires_at == pytest.approx(now + 100, abs=2)
    assert found[key(2)].expires_at == float("inf")
    assert store.delete_many([key(1), key(3)]) == 1
    assert store.get_many([key(1), key(2)]) == [None, value(2, 20)]


def test_a_killed_server_costs_little_and_the_store_recovers(tmp_path, caplog):
    server = RedisServer(tmp_path)
    server.start()
    store = RedisStore(server.url)
    caplog.set_level(logging.INFO, logger="deepring.cache")
    try:
        assert store.put_many([(key(1), value(1), 100)]) == 1
        server.kill()

        start = time.monotonic()
        for i in range(200):
            assert store.get_many([key(1), key(2)]) == [None, None]
            assert store.put_many([(key(i), value(i), 100)]) == 0
            assert store.delete_many([key(i)]) == 0
        assert time.monotonic() - start < 2.0
        errors = store.stats()["errors"]
        assert 1 <= errors <= 3  # the backoff: not one failure per call
        assert "not trying it again" in caplog.text

        server.start()  # same port
        deadline = time.monotonic() + 10  # the backoff is 0.5 s, doubling: a few seconds at most
        while store.put_many([(key(5), value(5), 100)]) != 1:
            assert time.monotonic() < deadline, "the store did not recover"
            time.sleep(0.05)
        assert store.get_many([key(5)]) == [value(5)]
        assert "working again" in caplog.text
    finally:
        store.close()
        server.kill()


def test_a_server_that_never_answers_costs_one_timeout(monkeypatch):
    """A host that accepts connections and then hangs: one socket timeout, then the backoff."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        accepted: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            listener.settimeout(0.05)
            while not stop.is_set():
                try:
                    accepted.append(listener.accept()[0])
                except TimeoutError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        port = listener.getsockname()[1]
        store = RedisStore(f"redis://127.0.0.1:{port}", socket_timeout=0.2, connect_timeout=0.2)
        try:
            start = time.monotonic()
            for _ in range(50):
                assert store.get_many([key(1)]) == [None]
            assert time.monotonic() - start < 1.5
            assert store.stats()["errors"] == 1
        finally:
            stop.set()
            thread.join(5)
            for conn in accepted:
                conn.close()
            store.close()


def test_passwords_stay_out_of_urls():
    assert redact("redis://:secret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("rediss://user:secret@[::1]:6380") == "rediss://user:***@[::1]:6380"
    assert redact("redis://h:6379") == "redis://h:6379"


# -- the CLI on Redis --------------------------------------------------------------------------


def test_cli_inspect_and_clear(server, store, client, capsys):
    store.put_many([(key(i), value(i, 100), 3600 * 24 * (i + 1)) for i in range(4)])
    client.set("other", "x")
    assert cli.main(["kv-store", "inspect", server.url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "redis"
    assert report["entries"] == 4
    assert report["bytes"] == 400
    assert report["remaining_ttl"] == {
        "expired": 0,
        "<1h": 0,
        "1h-1d": 1,
        "1d-3d": 2,
        "3d-7d": 1,
        ">=7d": 0,
    }
    assert cli.main(["kv-store", "clear", server.url, "--prefix", "other:", "--yes"]) == 0
    assert "removed 0 entries" in capsys.readouterr().out
    assert cli.main(["kv-store", "clear", server.url, "--yes"]) == 0
    assert "removed 4 entries" in capsys.readouterr().out
    assert client.get("other") == b"x"
    assert cli.main(["kv-store", "clear", server.url, "--expired-only"]) == 0
    assert "Redis expires entries itself" in capsys.readouterr().out


def test_cli_on_an_unreachable_server(capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["kv-store", "inspect", f"redis://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("deepring kv-store: cannot read the store: redis://127.0.0.1")
    assert err.count("\n") == 1
