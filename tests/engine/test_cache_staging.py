"""Device -> host copies of the prefix cache (cache.staging): a record handed over later is the
snapshot of the moment it was asked for, byte for byte what cache.transfer exports, and a
prefix-cache hit through those records equals a cold run.

The CUDA path (pinned buffers, a side stream, events) runs only where a GPU is present (`-m gpu`);
on CPU the copies are immediate and the same assertions hold."""

from __future__ import annotations

import pytest
import torch
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.cache.staging import HostCopies
from deepring.cache.transfer import export_blocks, export_ring, import_blocks, import_ring
from deepring.model.loader import load_model
from prefix_helpers import BLOCK, engine, ids, params, run
from v4_helpers import model_config


def _pool(device: str) -> KVCachePool:
    layout = model_config("swa-csa-hca").cache_layout(torch.float32)
    pool = KVCachePool(layout, CacheConfig(num_blocks=8, num_slots=4, block_size=BLOCK), device)
    gen = torch.Generator().manual_seed(3)
    for t in pool.block_tensors() + pool.slot_tensors():
        t.copy_(torch.randn(t.shape, generator=gen))
    return pool


def _devices() -> list:
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", _devices())
def test_a_copy_is_the_snapshot_of_when_it_was_asked(device):
    pool = _pool(device)
    want_blocks = bytes(export_blocks(pool, [2, 5]))
    want_ring = bytes(export_ring(pool, 1))
    got: dict[str, bytes] = {}
    copies = HostCopies(pool)
    copies.blocks([2, 5], lambda rec: got.__setitem__("blocks", rec))
    copies.ring(1, lambda rec: got.__setitem__("ring", rec))
    # The next step writes over the same block and ring before the copies land.
    for t in pool.block_tensors():
        t[2].fill_(7.0)
    for lc in pool.layers:
        lc.ring[1].fill_(-7.0)
    copies.drain()
    assert copies.pending == 0
    assert got == {"blocks": want_blocks, "ring": want_ring}


@pytest.mark.parametrize("device", _devices())
def test_records_round_trip_into_another_pool(device):
    src, dst = _pool(device), _pool(device)
    for t in dst.block_tensors() + dst.slot_tensors():
        t.zero_()
    got: list[bytes] = []
    copies = HostCopies(src)
    copies.blocks([1, 3], got.append)
    copies.ring(2, got.append)
    copies.drain()
    import_blocks(dst, got[0], [4, 6])
    import_ring(dst, got[1], 0)
    for a, b in zip(src.block_tensors(), dst.block_tensors(), strict=True):
        torch.testing.assert_close(a[[1, 3]], b[[4, 6]], rtol=0, atol=0)
    for a, b in zip(src.layers, dst.layers, strict=True):
        torch.testing.assert_close(a.ring[2], b.ring[0], rtol=0, atol=0)


def test_poll_hands_over_in_order_and_only_what_landed():
    pool = _pool("cpu")
    order: list[int] = []
    copies = HostCopies(pool)
    for blk in (0, 1, 2):
        copies.blocks([blk], lambda _rec, blk=blk: order.append(blk))
    assert copies.poll() == 0  # CPU copies are handed over at once
    assert order == [0, 1, 2]


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["ring", "host-exact"])
def test_cached_equals_cold_on_cuda(how):
    model = load_model(
        model_config("swa-csa-hca"), load_format="dummy", seed=7, dtype="float32", device="cuda"
    ).model
    first, second = ids(3 * BLOCK + 5, 1), ids(2 * BLOCK, 2)
    p = params(6)
    cold_eng, cold_rec = engine(model)
    want = run(cold_eng, cold_rec, None, first + second, p)
    eng, rec = engine(model, replay="exact")
    run(eng, rec, 1, first, p)
    eng.prefix.copies.drain()
    if how == "host-exact":
        eng.prefix.rings.clear()
        eng.blocks.drop_cached()
    out, hit, logits = run(eng, rec, 2, first + second, p)
    assert hit == 3 * BLOCK
    assert out == want[0]
    torch.testing.assert_close(logits, want[2], rtol=0, atol=2e-5)
