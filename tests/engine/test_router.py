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


def test_prefix_estimate_counts_remembered_full_blocks():
    from deepring.routing.prefix_estimate import PrefixEstimate

    est = PrefixEstimate(block_size=4, capacity=100)
    a = list(range(10))  # two full blocks usable (a hit leaves one token to compute)
    assert est.cached_tokens(a) == 0
    assert est.cached_tokens(a) == 8
    assert est.cached_tokens([*a, 11, 12, 13]) == 8  # the third block is new
    assert est.cached_tokens([*a, 11, 12, 13]) == 12
    assert est.cached_tokens([99, *a]) == 0  # same tokens, other positions: no hit
    assert est.cached_tokens(a[:4]) == 0  # one block only and nothing left to compute


def test_prefix_estimate_forgets_the_least_recent():
    from deepring.routing.prefix_estimate import PrefixEstimate

    est = PrefixEstimate(block_size=2, capacity=3)
    est.cached_tokens([1, 2, 3, 4, 5])  # 2 blocks remembered
    est.cached_tokens([7, 8, 9, 10, 11])  # 2 more: the oldest one goes
    assert est.cached_tokens([7, 8, 9, 10, 11]) == 4
    assert est.cached_tokens([1, 2, 3, 4, 5]) == 0


def test_the_router_weighs_only_the_uncached_tokens():
    """A long prompt whose prefix is cached costs its prefill worker only the rest."""
    from deepring.ipc.messages import Health
    from deepring.routing.registry import WorkerRegistry

    reg = WorkerRegistry(2, 1)
    for i, (name, role) in enumerate(
        (("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode"))
    ):
        info = {"role": role, "num_slots": 8, "num_blocks": 1000, "block_size": 128}
        reg.add(name, Health(worker=name, gen=1, state="ready", pid=100 + i, info=info))
    p, d = reg.route(4000, uncached=100)
    reg.assign(1, 4000, p, d, uncached=100)
    assert p.load.queued_tokens == 100
    # The other prefill worker is idle: a prompt of 50 new tokens goes there...
    q, _ = reg.route(50)
    assert q is not p
    reg.assign(2, 50, q, d)
    # ...and a 3000-token prompt with 2944 cached (56 new) goes to the less loaded one (q:
    # 50 + 56 against p: 100 + 56), which counting all its tokens would not tell apart.
    r, _ = reg.route(3000, uncached=56)
    assert r is q
    reg.prefilled(1, 100, p)
    assert p.load.queued_tokens == 0


def test_grew_many_books_what_grew_does_one_by_one():
    """The registry's batched grew (the simulator's token messages) adds what a grew per
    request would: only for the requests the decode worker holds, repeats included."""
    from deepring.ipc.messages import Health
    from deepring.routing.registry import WorkerRegistry

    regs = []
    for _ in range(2):
        reg = WorkerRegistry(1, 1)
        for i, (name, role) in enumerate((("prefill-0", "prefill"), ("decode-0", "decode"))):
            info = {"role": role, "num_slots": 8, "num_blocks": 1000, "block_size": 128}
            reg.add(name, Health(worker=name, gen=1, state="ready", pid=100 + i, info=info))
        p, d = reg.route(300)
        for rid in (1, 2, 3):
            reg.assign(rid, 300, p, d)
        regs.append((reg, d))
    (one, d1), (many, d2) = regs
    for rid in (1, 2, 9, 2):
        one.grew(rid, "decode-0", 5)
    many.grew_many([1, 2, 9, 2], "decode-0", 5)
    many.grew_many([1], "decode-7", 5)  # a worker it does not know: nothing
    assert d1.load.used_tokens == d2.load.used_tokens == 900 + 15
