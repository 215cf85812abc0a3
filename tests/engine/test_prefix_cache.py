"""Prefix KV cache in one engine: a request served from a cached prefix (device or host tier,
with the ring snapshot or replaying it) generates what a cold run generates, with the same
logits; cached blocks are never rewritten; the allocator's LRU and the TTLs behave."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from deepring.cache.allocator import BlockAllocator
from deepring.cache.prefix import HostTier, chain_keys, root_key
from deepring.cache.transfer import export_blocks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prefix_helpers import BLOCK, engine, ids, params, run
from v4_helpers import model_config, ours

ATOL = 2e-5  # chunked prefill against unchunked (test_cache_properties)


@pytest.fixture(scope="module")
def model():
    return ours(model_config("swa-csa-hca"), seed=7)


@pytest.fixture(scope="module")
def cold(model):
    return engine(model)


def _turns(model, replay, first, second, p, clear_rings=False, host_only=False):
    eng, rec = engine(model, replay=replay)
    run(eng, rec, 1, first, p)
    if clear_rings:
        eng.prefix.rings.clear()
    if host_only:  # the device tier forgets: the next hit comes from host records
        eng.blocks.drop_cached()
    return eng, run(eng, rec, 2, second, p)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n_first=st.integers(BLOCK + 1, 5 * BLOCK + 3),
    n_more=st.integers(1, 3 * BLOCK),
    seed=st.integers(0, 1000),
    how=st.sampled_from(["ring", "exact", "host-ring", "host-exact"]),
    temperature=st.sampled_from([0.0, 0.8]),
)
def test_cached_equals_cold(model, cold, n_first, n_more, seed, how, temperature):
    """A conversation's next turn: the second prompt extends the first (at any block
    boundary); its output and logits equal a cold run's, whichever tier it hits and whether
    the ring was kept or replayed exactly."""
    first = ids(n_first, seed)
    second = first + ids(n_more, seed + 1)
    p = params(4, temperature)
    ref_out, _, ref_logits = run(*cold, None, second, p)
    eng, (out, hit, logits) = _turns(
        model, "exact", first, second, p,
        clear_rings="exact" in how, host_only=how.startswith("host"),
    )  # fmt: skip
    assert hit == min(n_first // BLOCK, (len(second) - 1) // BLOCK) * BLOCK
    assert out == ref_out
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    stats = eng.prefix.report()
    assert stats["hit_tokens"] == hit
    if "exact" in how:
        assert stats["ring_misses"] == 1
        assert stats["replayed_tokens"] > 0
    else:
        assert stats["ring_hits"] == 1
        assert stats["replayed_tokens"] == 0


def test_ring_hit_is_bitwise_a_cold_run_split_at_the_hit(model):
    """With the ring snapshot the cached run does exactly the computation of a cold run whose
    prefill is cut at the same points (the hit, and the prompt's last block boundary where
    the ring is snapshotted): the logits are bit for bit the same."""
    first = ids(3 * BLOCK + 5, 1)
    second = first + ids(20, 2)
    p = params(3)
    _, (out, hit, logits) = _turns(model, "exact", first, second, p)
    assert hit == 3 * BLOCK
    # A fresh engine (nothing cached) with a budget of `hit` cuts the cold prefill there.
    eng, rec = engine(model, replay="exact", budget=hit)
    ref_out, _, ref_logits = run(eng, rec, 1, second, p)
    assert out == ref_out
    assert torch.equal(logits, ref_logits)


def test_cached_blocks_are_never_rewritten(model):
    first = ids(4 * BLOCK + 2, 3)
    second = first + ids(30, 4)
    eng, rec = engine(model, replay="exact")
    run(eng, rec, 1, first, params(2))
    keys = chain_keys(eng.prefix.root, first, BLOCK)
    blocks = [eng.blocks.lookup(k) for k in keys]
    before = bytes(export_blocks(eng.pool, blocks))
    eng.prefix.rings.clear()  # force a replay over the cached blocks
    run(eng, rec, 2, second, params(2))
    assert bytes(export_blocks(eng.pool, blocks)) == before


@pytest.mark.parametrize("replay", ["exact", "bounded"])
def test_replay_reads_nothing_before_its_floor(model, replay):
    """The ring rows below a replay's floor are never read: poisoned with NaN, the output is
    unchanged."""
    first = ids(4 * BLOCK + 1, 5)
    second = first + ids(9, 6)
    p = params(3)
    results = []
    for poison in (False, True):
        eng, rec = engine(model, replay=replay)
        run(eng, rec, 1, first, p)
        eng.prefix.rings.clear()
        if poison:
            for lc in eng.pool.layers:
                lc.ring.fill_(float("nan"))
        out, hit, logits = run(eng, rec, 2, second, p)
        assert hit == 4 * BLOCK
        assert torch.isfinite(logits).all()
        results.append((out, logits))
    assert results[0][0] == results[1][0]
    assert torch.equal(results[0][1], results[1][1])


def test_bounded_replay_of_a_short_prefix_is_exact(model, cold):
    """Bounded replay recomputes `window` tokens; when that reaches back to position 0 nothing
    is approximated and the result is a cold run's."""
    eng, _ = engine(model, replay="bounded")
    assert eng.prefix.replay_tokens == model.config.sliding_window
    first = ids(BLOCK + 3, 7)  # one block: the hit (16) is within two windows (8)
    second = first + ids(5, 8)
    p = params(3)
    ref_out = run(*cold, None, second, p)[0]
    _, (out, hit, logits) = _turns(model, "bounded", first, second, p, clear_rings=True)
    assert hit == BLOCK
    assert out == ref_out
    # A hit of 16 with a window of 8 replays positions 8..15: approximate, but close.
    assert torch.isfinite(logits).all()


def test_requests_sharing_a_prefix_in_one_batch(model, cold):
    """Several requests with one prefix, admitted together and one after another, each match
    its cold run."""
    base = ids(3 * BLOCK, 9)
    prompts = [base + ids(7 + i, 20 + i) for i in range(3)]
    p = params(4)
    refs = [run(*cold, None, q, p)[0] for q in prompts]
    eng, rec = engine(model, replay="exact")
    run(eng, rec, 1, [*base, 1], p)
    reqs = [eng.add(10 + i, q, p, 5) for i, q in enumerate(prompts)]
    for _ in range(1000):
        if not eng.has_work:
            break
        eng.step()
    assert [r.output_ids for r in reqs] == refs
    assert all(r.cache_hit == 3 * BLOCK for r in reqs)


def test_eviction_under_a_small_pool_keeps_outputs_right(model, cold):
    """A pool too small to keep every prefix: cached blocks are evicted LRU-first (to the host
    tier) and later hits come from the host tier; outputs stay a cold run's."""
    p = params(3)
    prompts = [ids(3 * BLOCK + 2, 40 + i) for i in range(4)]
    eng, rec = engine(model, replay="exact", num_blocks=12)
    for i, q in enumerate(prompts):
        run(eng, rec, i, q, p)
    assert eng.blocks.num_evictions > 0
    for i, q in enumerate(prompts):
        out, hit, _ = run(eng, rec, 10 + i, [*q, 7, 8], p)
        assert hit == 3 * BLOCK
        assert out == run(*cold, None, [*q, 7, 8], p)[0]
    assert eng.prefix.report()["hit_blocks_host"] > 0


def test_preempted_request_recomputes_from_its_own_blocks(model, cold):
    p = params(40)
    prompts = [ids(2 * BLOCK + 3, 60 + i) for i in range(3)]
    refs = [run(*cold, None, q, p)[0] for q in prompts]
    eng, _ = engine(model, replay="exact", num_blocks=10)
    reqs = [eng.add(i, q, p, 5) for i, q in enumerate(prompts)]
    for _ in range(5000):
        if not eng.has_work:
            break
        eng.step()
    assert eng.scheduler.num_preemptions > 0
    assert [r.output_ids for r in reqs] == refs


def test_a_different_model_identity_never_hits(model):
    first = ids(3 * BLOCK, 11)
    eng, rec = engine(model, replay="exact", identity="weights-a")
    run(eng, rec, 1, first, params(2))
    other = root_key("weights-b", b"\0" * 16)
    assert chain_keys(other, first, BLOCK)[0] != chain_keys(eng.prefix.root, first, BLOCK)[0]


# ---- the allocator's device tier and the host tier -------------------------------------------


def test_allocator_keeps_published_blocks_until_room_is_needed():
    a = BlockAllocator(5)  # 4 usable
    b1, b2 = a.allocate(2)
    assert a.publish(b1, b"k1")
    assert a.publish(b2, b"k2")
    assert not a.publish(b2, b"k3")  # one key per block
    a.free([b1, b2])
    assert a.num_free == 4
    assert a.num_cached == 2
    a.take(b2)  # revived: no longer evictable
    got = a.allocate(3)  # two free blocks, then the LRU cached one (b1)
    assert b1 in got
    assert b2 not in got
    assert a.num_evictions == 1
    assert a.lookup(b"k1") is None
    assert a.lookup(b"k2") == b2
    with pytest.raises(Exception, match="need"):
        a.allocate(1)


@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=40), cap=st.integers(0, 200))
def test_host_tier_stays_within_its_bytes_and_keeps_the_newest(sizes, cap):
    t = HostTier(cap)
    for i, n in enumerate(sizes):
        t.put(bytes([i % 256]) * 4 + i.to_bytes(4, "little"), b"x" * n)
        assert t.bytes <= cap
    last = len(sizes) - 1
    key = bytes([last % 256]) * 4 + last.to_bytes(4, "little")
    assert (t.get(key) is not None) == (sizes[-1] <= cap)


def test_host_tier_ttl_with_an_injected_clock():
    now = [100.0]
    t = HostTier(1000, clock=lambda: now[0])
    t.put(b"a", b"1", ttl_s=180)
    t.put(b"b", b"2")
    now[0] += 179.9
    assert t.get(b"a") == b"1"
    now[0] += 0.2
    assert t.get(b"a") is None
    assert t.get(b"b") == b"2"
    assert t.stats["expired"] == 1


@pytest.mark.parametrize("budget", [5, 11, 24])
def test_a_replay_split_over_many_steps_equals_a_cold_run(model, cold, budget):
    """A small step budget cuts the replayed window into chunks that end before the hit (and
    shares steps with another request): each chunk still starts from the replay's floor and
    writes nothing into the cached blocks."""
    first = ids(5 * BLOCK + 3, 13)
    second = first + ids(12, 14)
    other = ids(40, 15)
    p = params(3)
    refs = [run(*cold, None, q, p)[0] for q in (second, other)]
    eng, rec = engine(model, replay="exact", budget=budget)
    run(eng, rec, 1, first, p)
    eng.prefix.rings.clear()
    reqs = [eng.add(10 + i, q, p, 5) for i, q in enumerate((second, other))]
    for _ in range(5000):
        if not eng.has_work:
            break
        eng.step()
    assert reqs[0].cache_hit == 5 * BLOCK
    assert eng.prefix.report()["replayed_tokens"] > budget
    assert [r.output_ids for r in reqs] == refs


def test_ring_snapshots_expire_after_their_ttl(model, cold):
    """A ring snapshot older than its TTL (180 s by default) is gone: the next hit replays,
    and still matches a cold run."""
    now = [1000.0]
    eng, rec = engine(model, replay="exact", clock=lambda: now[0])
    first = ids(3 * BLOCK + 4, 70)
    p = params(3)
    run(eng, rec, 1, first, p)
    now[0] += eng.prefix.config.ring_ttl_s - 1
    run(eng, rec, 2, [*first, 1], p)
    assert eng.prefix.report()["ring_hits"] == 1
    now[0] += 2  # the first turn's snapshots are now past their TTL
    second = [*first, 2, 3]
    out, hit, _ = run(eng, rec, 3, second, p)
    stats = eng.prefix.report()
    assert hit == 3 * BLOCK
    assert stats["ring_misses"] == 1
    assert stats["ring_expired"] >= 1
    assert out == run(*cold, None, second, p)[0]


def test_the_pool_is_sized_by_bytes(deepring_cache_dir):
    from deepring.config import EngineSpec
    from deepring.core.build import build_engine

    spec = EngineSpec(model="tiny", max_model_len=512, max_num_seqs=2, dtype="float32")
    per_block = build_engine(spec).engine.pool.bytes_per_block()
    sized = dataclasses.replace(spec, kv_cache_memory=40 * per_block + per_block // 2)
    assert build_engine(sized).engine.pool.cache.num_blocks == 40
    with pytest.raises(ValueError, match="kv-cache-memory"):
        build_engine(dataclasses.replace(spec, kv_cache_memory=3 * per_block))


def test_the_pool_is_sized_by_a_fraction_of_free_memory(deepring_cache_dir, monkeypatch):
    from deepring.config import EngineSpec
    from deepring.core import build

    spec = EngineSpec(model="tiny", max_model_len=512, max_num_seqs=2, dtype="float32")
    per_block = build.build_engine(spec).engine.pool.bytes_per_block()
    assert build.free_memory(torch.device("cpu")) > 0  # the real host figure
    monkeypatch.setattr(build, "free_memory", lambda device: 100 * per_block)
    sized = dataclasses.replace(spec, kv_cache_fraction=0.25)
    assert build.build_engine(sized).engine.pool.cache.num_blocks == 25
    with pytest.raises(ValueError, match="kv_cache_fraction"):
        dataclasses.replace(spec, kv_cache_fraction=0.99)
