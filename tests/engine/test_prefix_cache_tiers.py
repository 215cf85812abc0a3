"""The prefix cache's persistent tiers under a real engine: a directory store and a real
redis-server serve a prefix to a restarted engine and to another engine (another worker or
machine sharing the store), with the output of a cold run; damaged records, a killed Redis and
a failing disk are misses, never errors; TTL classes reach the store."""

from __future__ import annotations

import pytest
import torch
from deepring.cache.store import DirectoryStore, open_store
from deepring.cache.store.tiered import TieredStore
from kv_store_helpers import RedisServer
from prefix_helpers import BLOCK, engine, ids, params, run
from v4_helpers import model_config, ours


@pytest.fixture(scope="module")
def model():
    return ours(model_config("swa-csa-hca"), seed=7)


@pytest.fixture(scope="module")
def cold(model):
    return engine(model)


@pytest.fixture(scope="module")
def redis_module(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture
def redis_server(redis_module):
    import redis

    with redis.Redis.from_url(redis_module.url) as c:
        c.flushdb()  # each test starts from an empty shared tier
    return redis_module


def _serve_turns(model, store, first, second, p, **kw):
    """Turn 1 on one engine; turn 2 on a fresh engine (a restart, or another worker) that
    shares only the store."""
    eng, rec = engine(model, replay="exact", store=store, **kw)
    run(eng, rec, 1, first, p)
    eng.prefix.drain()
    eng2, rec2 = engine(model, replay="exact", store=store, **kw)
    return eng2, run(eng2, rec2, 2, second, p)


def _conversation(seed: int, n_first: int = 4 * BLOCK + 5, n_more: int = 21):
    first = ids(n_first, seed)
    return first, first + ids(n_more, seed + 1)


@pytest.mark.parametrize("kind", ["directory", "redis", "both"])
def test_a_restarted_engine_hits_the_store_and_matches_a_cold_run(
    model, cold, tmp_path, redis_server, kind
):
    stores = {
        "directory": lambda: DirectoryStore(tmp_path / "kv"),
        "redis": lambda: open_store(redis_server.url),
        "both": lambda: TieredStore(
            [DirectoryStore(tmp_path / "kv2"), open_store(redis_server.url)]
        ),
    }
    store = stores[kind]()
    first, second = _conversation(3)
    p = params(4, temperature=0.7)  # sampled: a seeded stream over the same logits
    ref, _, ref_logits = run(*cold, None, second, p)
    eng, (out, hit, logits) = _serve_turns(model, store, first, second, p)
    assert hit == 4 * BLOCK
    assert out == ref
    torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=0)
    stats = eng.prefix.report()
    assert stats["hit_blocks_store"] == 4
    # The ring snapshot of the prompt's last block boundary was stored too: no replay.
    assert stats["ring_hits"] == 1
    assert stats["replayed_tokens"] == 0


def test_a_store_without_ring_snapshots_replays_exactly(model, cold, tmp_path):
    store = DirectoryStore(tmp_path / "kv")
    first, second = _conversation(5)
    p = params(4)
    eng, rec = engine(model, replay="exact", store=store)
    run(eng, rec, 1, first, p)
    eng.prefix.drain()
    for key in [k for k, _ in _ring_keys(eng, first)]:
        store.delete_many([key])
    eng2, rec2 = engine(model, replay="exact", store=store)
    out, hit, _ = run(eng2, rec2, 2, second, p)
    assert hit == 4 * BLOCK
    assert out == run(*cold, None, second, p)[0]
    assert eng2.prefix.report()["ring_misses"] == 1


def _ring_keys(eng, prompt):
    from deepring.cache.prefix import chain_keys, ring_key

    return [(ring_key(k), k) for k in chain_keys(eng.prefix.root, prompt, BLOCK)]


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "version"])
def test_damaged_block_files_are_misses(model, cold, tmp_path, damage):
    """A stored block that fails its checks (the store's frame or the engine's record) is a
    miss: the prefix is recomputed from there, the output is a cold run's."""
    from deepring.cache.prefix import chain_keys

    store = DirectoryStore(tmp_path / "kv")
    first, second = _conversation(7)
    p = params(3)
    eng, rec = engine(model, replay="exact", store=store)
    run(eng, rec, 1, first, p)
    eng.prefix.drain()
    keys = chain_keys(eng.prefix.root, first, BLOCK)
    path = store.path_of(keys[2])
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-7] ^= 0x40
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    bad = b""
    if damage in ("foreign", "version"):  # a valid store entry whose record the engine refuses
        (other,) = store.get_many([keys[2]])
        bad = bytearray(other)
        if damage == "foreign":
            bad[8] ^= 0xFF  # inside the record's layout fingerprint
        else:
            bad[4] += 1  # the record's format version
        store.put_many([(keys[2], bytes(bad), 60.0)])
    eng2, rec2 = engine(model, replay="exact", store=store)
    out, hit, _ = run(eng2, rec2, 2, second, p)
    assert hit == 2 * BLOCK  # blocks 0 and 1 still hit; block 2 and after are recomputed
    assert out == run(*cold, None, second, p)[0]
    if damage in ("foreign", "version"):
        assert eng2.prefix.report()["bad_records"] == 1
        eng2.prefix.drain()
        # Deleted from the store, then replaced by the block this engine recomputed.
        (now,) = store.get_many([keys[2]])
        assert now is not None
        assert now != bytes(bad)
    else:
        assert store.stats()["corrupt"] == 1


def test_a_killed_redis_degrades_to_misses(model, cold, tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis-kill"))
    srv.start()
    store = open_store(srv.url)
    first, second = _conversation(9)
    p = params(3)
    eng, rec = engine(model, replay="exact", store=store)
    run(eng, rec, 1, first, p)
    eng.prefix.drain()
    srv.kill()  # mid-run: the next engine cannot read, and its writes fail
    eng2, rec2 = engine(model, replay="exact", store=store)
    out, hit, _ = run(eng2, rec2, 2, second, p)
    eng2.prefix.drain()
    assert hit == 0
    assert out == run(*cold, None, second, p)[0]
    assert store.stats()["errors"] >= 1


def test_a_full_disk_loses_nothing_but_the_cache(model, cold, tmp_path, monkeypatch):
    import deepring.cache.store.directory as directory

    store = DirectoryStore(tmp_path / "kv")

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(directory.os, "replace", full)
    first, second = _conversation(11)
    p = params(3)
    eng, rec = engine(model, replay="exact", store=store)
    assert run(eng, rec, 1, first, p)[0] == run(*cold, None, first, p)[0]
    eng.prefix.drain()
    assert store.stats()["errors"] >= 1
    monkeypatch.undo()
    eng2, rec2 = engine(model, replay="exact", store=store)
    out, hit, _ = run(eng2, rec2, 2, second, p)
    assert hit == 0
    assert out == run(*cold, None, second, p)[0]


def test_agent_requests_are_stored_with_the_agent_ttl(model, tmp_path):
    store = DirectoryStore(tmp_path / "kv")
    eng, _ = engine(model, replay="exact", store=store)
    cfg = eng.prefix.config
    for rid, cls in ((1, "chat"), (2, "agent")):
        req = eng.add(rid, ids(2 * BLOCK + 1, 20 + rid), params(1), 5, cls)
        while not req.finished:
            eng.step()
    eng.prefix.drain()
    ttls = sorted({round(b.expires_at - store.clock()) for b in store.scan()})
    assert ttls == sorted({round(cfg.ring_ttl_s), round(cfg.chat_ttl_s), round(cfg.agent_ttl_s)})
