"""Router: prefill by estimated work, decode by free slots and blocks."""

from __future__ import annotations

import pytest
from deepring.routing.router import Router, WorkerLoad


def test_prefill_goes_to_the_least_work():
    r = Router()
    loads = [
        WorkerLoad("prefill-0", queued_tokens=900),
        WorkerLoad("prefill-1", queued_tokens=100),
        WorkerLoad("prefill-2", queued_tokens=400),
    ]
    assert r.pick_prefill(loads, 50).worker == "prefill-1"
    # Uncached tokens differ per worker (one has the prefix cached): total work decides.
    uncached = {"prefill-0": 0, "prefill-1": 1000, "prefill-2": 600}
    assert r.pick_prefill(loads, uncached).worker == "prefill-0"


def test_prefill_skips_workers_that_are_not_ready():
    r = Router()
    loads = [WorkerLoad("prefill-0", ready=False), WorkerLoad("prefill-1", queued_tokens=10**6)]
    assert r.pick_prefill(loads, 1).worker == "prefill-1"
    assert r.pick_prefill([WorkerLoad("prefill-0", ready=False)], 1) is None
    assert r.pick_prefill([], 1) is None


def test_prefill_ties_rotate_then_prefer_fewer_requests():
    r = Router()
    loads = [WorkerLoad(f"prefill-{i}") for i in range(3)]
    picks = {r.pick_prefill(loads, 10).worker for _ in range(6)}
    assert picks == {"prefill-0", "prefill-1", "prefill-2"}
    loads[1].requests = 0
    loads[0].requests = loads[2].requests = 2
    assert r.pick_prefill(loads, 10).worker == "prefill-1"


def _decode(name: str, slots: int, blocks: int, requests: int = 0, used_tokens: int = 0):
    return WorkerLoad(
        name, num_slots=slots, num_blocks=blocks, requests=requests, used_tokens=used_tokens
    )


def test_decode_prefers_headroom_in_slots_and_blocks():
    r = Router(block_size=128)
    a = _decode("decode-0", slots=8, blocks=100, requests=6)  # slots nearly full
    b = _decode("decode-1", slots=8, blocks=100, requests=2, used_tokens=80 * 128)  # blocks
    c = _decode("decode-2", slots=8, blocks=100, requests=3, used_tokens=20 * 128)
    assert r.pick_decode([a, b, c], 100).worker == "decode-2"
    assert c.free_slots() == 5
    assert c.free_blocks(128) == 100 - 20 - 3


def test_decode_that_fits_beats_one_that_does_not():
    r = Router(block_size=128)
    full = _decode("decode-0", slots=4, blocks=1000, requests=4)
    tight = _decode("decode-1", slots=64, blocks=10, requests=1, used_tokens=5 * 128)
    # decode-1 has little headroom but can take a 300-token prompt now; decode-0 cannot.
    assert r.pick_decode([full, tight], 300).worker == "decode-1"
    # A prompt decode-1 cannot hold either: the one with more headroom still gets it.
    assert r.pick_decode([full, tight], 5000).worker == "decode-1"
    down = _decode("decode-2", slots=64, blocks=1000)
    down.ready = False
    assert r.pick_decode([full, down], 10).worker == "decode-0"
    assert r.pick_decode([down], 10) is None


def test_ties_alternate_when_requests_come_one_at_a_time():
    # Both roles picked for every request, loads always equal: each role rotates on its own.
    r = Router()
    pre = [WorkerLoad("prefill-0"), WorkerLoad("prefill-1")]
    dec = [_decode("decode-0", 4, 100), _decode("decode-1", 4, 100)]
    picks = [(r.pick_prefill(pre, 10).worker, r.pick_decode(dec, 10).worker) for _ in range(4)]
    assert {p for p, _ in picks} == {"prefill-0", "prefill-1"}
    assert {d for _, d in picks} == {"decode-0", "decode-1"}


def test_router_rejects_a_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        Router(block_size=0)
