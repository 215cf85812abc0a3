"""Prefill and decode roles driven message by message (every message through the codec):
first token straight to the frontend, handoff, continuous batching, admission by free blocks,
preemption, aborts, stale and late handoffs, bad requests."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from deepring import LLM, SamplingParams
from deepring.config import EngineSpec
from deepring.core.build import build_engine
from deepring.ipc import codec
from deepring.ipc.messages import Abort, Handoff, Submit, Tokens
from deepring.worker.roles import DecodeRole, PrefillRole

GEN = 77


def _wire(msg):
    return codec.decode_strict([bytes(f) for f in codec.encode(msg)])


class FakeLink:
    def __init__(self) -> None:
        self.frontend: list[Tokens] = []
        self.handoffs: list[Handoff] = []

    def to_frontend(self, msg, link: int = 0) -> None:
        assert link == 0
        self.frontend.append(_wire(msg))

    def handoff(self, addr: str, msg: Handoff) -> None:
        assert addr == "ipc:///nowhere/handoff-0"
        self.handoffs.append(_wire(msg))

    def take(self) -> tuple[list[Tokens], list[Handoff]]:
        out = self.frontend, self.handoffs
        self.frontend, self.handoffs = [], []
        return out


def _submit(rid: int, prompt: list[int], params: SamplingParams, seed: int = 0) -> Submit:
    return _wire(
        Submit(
            rid=rid,
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            sampling=params,
            seed=seed,
            decode_worker="decode-0",
            decode_gen=GEN,
            decode_addr="ipc:///nowhere/handoff-0",
            cache_class="chat",
            num_output=0,
        )
    )


class Stream:
    """What the frontend would reassemble from Tokens messages."""

    def __init__(self) -> None:
        self.tokens: dict[int, dict[int, int]] = {}
        self.finished: dict[int, tuple[str, int]] = {}
        self.errors: dict[int, str] = {}

    def feed(self, msgs: list[Tokens]) -> None:
        for m in msgs:
            pos = 0
            for rid, off, n in zip(m.rids, m.offsets, m.counts, strict=True):
                for i in range(n):
                    self.tokens.setdefault(rid, {})[off + i] = int(m.token_ids[pos + i])
                pos += n
            for rid, reason, total in m.finished:
                self.finished[rid] = (reason, total)
            for rid, message in m.errors:
                self.errors[rid] = message

    def ids(self, rid: int) -> list[int]:
        got = self.tokens.get(rid, {})
        assert sorted(got) == list(range(len(got))), "offsets must be contiguous"
        return [got[i] for i in range(len(got))]


def _pipeline(prefill_spec: EngineSpec, decode_spec: EngineSpec):
    link = FakeLink()
    pre = PrefillRole(build_engine(prefill_spec).engine, link, "prefill-0", 5)
    dec = DecodeRole(build_engine(decode_spec).engine, link, "decode-0", GEN)
    return link, pre, dec


def _run(link: FakeLink, pre: PrefillRole, dec: DecodeRole, stream: Stream, steps: int = 10_000):
    for _ in range(steps):
        if not (pre.busy or dec.busy):
            return
        if pre.busy:
            pre.step()
        frontend, handoffs = link.take()
        stream.feed(frontend)
        for h in handoffs:
            dec.handle(h)
        if dec.busy:
            dec.step()
        stream.feed(link.take()[0])
    raise AssertionError("did not finish")


SPEC = EngineSpec(model="tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=96)
ZERO = dataclasses.replace(SPEC, zero_cost=True)


def _prompt(n: int, salt: int) -> list[int]:
    return [(17 * j + 101 * salt) % 120000 + 3 for j in range(n)]


@pytest.fixture(scope="module")
def llm(deepring_cache_dir):
    return LLM("tiny", max_num_seqs=4, max_model_len=512, max_num_batched_tokens=96)


def test_prefill_decode_pipeline_matches_offline_generation(llm):
    link, pre, dec = _pipeline(SPEC, SPEC)
    prompts = [_prompt(n, i) for i, n in enumerate((5, 140, 60, 90, 33))]
    params = [
        SamplingParams(temperature=0, max_tokens=8),
        SamplingParams(temperature=0.8, top_p=0.9, seed=4, max_tokens=6),
        SamplingParams(temperature=0, max_tokens=1),  # ends in prefill: no handoff
        SamplingParams(temperature=1.0, top_k=40, seed=9, max_tokens=7),
        SamplingParams(temperature=0, max_tokens=5),
    ]
    want = [o.token_ids for o in llm.generate(prompts, params)]
    for rid, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        pre.handle(_submit(rid, p, sp, sp.seed or 0))
    stream = Stream()
    # First step: the two prompts that fit the 96-token budget are prefilled; their first
    # tokens reach the frontend before any handoff is sent.
    pre.step()
    first, handoffs = link.take()
    assert len(first) == 1
    assert first[0].offsets == [0] * len(first[0].rids)
    assert [h.rid for h in handoffs] == first[0].rids
    stream.feed(first)
    for h in handoffs:
        dec.handle(h)
    _run(link, pre, dec, stream)
    for rid, w in enumerate(want):
        assert stream.ids(rid) == w
        assert stream.finished[rid] == ("length", len(w))
    assert not stream.errors
    for role in (pre, dec):
        assert role.engine.blocks.num_used == 0
        assert role.engine.slots.num_free == role.engine.slots.num_slots


def test_decode_admits_by_free_blocks(llm):
    # Decode pool: 4 usable blocks of 128 tokens. Three requests of ~120 prompt tokens each
    # grow past their first block while decoding: the third waits until there is room.
    small = dataclasses.replace(SPEC, num_blocks=5, max_model_len=384)
    link, pre, dec = _pipeline(SPEC, small)
    prompts = [_prompt(n, 10 + i) for i, n in enumerate((120, 118, 124))]
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)] * 3
    want = [o.token_ids for o in llm.generate(prompts, params)]
    for rid, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        pre.handle(_submit(rid, p, sp))
    stream = Stream()
    waited = False
    for _ in range(1000):
        if not (pre.busy or dec.busy):
            break
        if pre.busy:
            pre.step()
        frontend, handoffs = link.take()
        stream.feed(frontend)
        for h in handoffs:
            dec.handle(h)
        dec.step()
        waited |= bool(dec.pending)
        stream.feed(link.take()[0])
    assert waited, "a handoff should have waited for free blocks"
    assert [stream.ids(r) for r in range(3)] == want
    assert dec.engine.blocks.num_used == 0


def test_decode_preempts_and_recomputes_when_blocks_run_out():
    # Two requests admitted with room for their next block each, but both grow by two more
    # blocks: the younger is preempted, recomputed by the decode worker, and still produces
    # the tokens it would have produced alone.
    small = dataclasses.replace(ZERO, num_blocks=5, max_model_len=384)
    link, pre, dec = _pipeline(ZERO, small)
    alone = build_engine(ZERO).engine
    prompts = [_prompt(120, 20 + i) for i in range(2)]
    params = SamplingParams(max_tokens=150)
    want = []
    for rid, p in enumerate(prompts):
        req = alone.add(rid, p, params, 1000 + rid)
        while not req.finished:
            alone.step()
        want.append(req.output_ids)
        pre.handle(_submit(rid, p, params, seed=1000 + rid))
    stream = Stream()
    _run(link, pre, dec, stream)
    assert dec.engine.scheduler.num_preemptions > 0
    assert [stream.ids(r) for r in range(2)] == want
    assert dec.engine.blocks.num_used == 0


def test_abort_frees_blocks_at_once_and_drops_late_handoffs():
    link, pre, dec = _pipeline(ZERO, ZERO)
    stream = Stream()
    for rid in (1, 2):
        pre.handle(_submit(rid, _prompt(200, rid), SamplingParams(max_tokens=300)))
    while pre.busy:
        pre.step()
    frontend, handoffs = link.take()
    stream.feed(frontend)
    assert not stream.errors
    assert sorted(h.rid for h in handoffs) == [1, 2]
    dec.handle(handoffs[0])
    dec.step()
    held = dec.engine.blocks.num_used
    assert held > 0
    # Abort the running one and, before its handoff arrives, the other.
    dec.handle(_wire(Abort(rids=[1, 2], reason="client disconnected")))
    assert dec.engine.blocks.num_used == 0
    dec.handle(handoffs[1])  # arrives after its abort: dropped
    assert not dec.busy
    # Aborting in prefill frees the prefill worker's blocks the same way.
    pre.handle(_submit(3, _prompt(300, 3), SamplingParams(max_tokens=4)))
    pre.engine.scheduler.config = dataclasses.replace(
        pre.engine.scheduler.config, max_num_batched_tokens=100
    )
    pre.step()
    assert pre.engine.blocks.num_used > 0
    pre.handle(_wire(Abort(rids=[3], reason="client disconnected")))
    assert pre.engine.blocks.num_used == 0
    assert not pre.busy
    assert not link.take()[1]


def test_handoff_for_an_earlier_decode_incarnation_is_dropped():
    link, pre, dec = _pipeline(ZERO, ZERO)
    pre.handle(_submit(1, _prompt(10, 1), SamplingParams(max_tokens=5)))
    pre.step()
    (h,) = link.take()[1]
    dec.gen = GEN + 1  # the decode worker restarted since the request was routed
    dec.handle(h)
    assert not dec.busy


# Bad sampling maps never reach a role: the codec refuses them (test_ring_messages).
@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ([5] * 500, SamplingParams(max_tokens=100), "exceeds max_model_len"),
        ([129281], SamplingParams(max_tokens=4), "out of range"),
    ],
)
def test_bad_requests_come_back_as_errors(prompt, params, match):
    link, pre, _ = _pipeline(ZERO, ZERO)
    pre.handle(_submit(9, prompt, params))
    (tokens,), _ = link.take()
    assert tokens.errors[0][0] == 9
    assert match in tokens.errors[0][1]
    assert not pre.busy


def test_draining_workers_refuse_new_work():
    link, pre, dec = _pipeline(ZERO, ZERO)
    pre.handle(_submit(1, _prompt(10, 1), SamplingParams(max_tokens=5)))
    pre.step()
    (h,) = link.take()[1]
    pre.draining = dec.draining = True
    pre.handle(_submit(2, _prompt(10, 2), SamplingParams(max_tokens=5)))
    dec.handle(h)
    frontend, _ = link.take()
    stream = Stream()
    stream.feed(frontend)
    assert set(stream.errors) == {1, 2}
    assert all("shutting down" in m for m in stream.errors.values())


def test_ids_in_range_agrees_with_a_plain_check():
    """token_ids.ids_in_range (the engine's check of every prompt) against a Python test of
    each id, on lists and int32 arrays, in range, at both edges and past them."""
    import numpy as np
    from deepring.token_ids import ids_in_range

    vocab = 1000
    cases = [[], [0], [999], [1000], [-1], [5, 7, 999], [5, -3, 7], [2**40], [3, 4] * 500]
    for ids in cases:
        want = all(0 <= t < vocab for t in ids)
        assert ids_in_range(ids, vocab) == want, ids
        if all(-(2**31) <= t < 2**31 for t in ids):
            assert ids_in_range(np.asarray(ids, dtype=np.int32), vocab) == want, ids
