"""Prefill -> decode handoff: a request prefilled in one worker's pool and continued in
another's (different slot, different blocks, through the wire format) generates exactly what
one engine generates alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from deepring import LLM, SamplingParams
from deepring.config import EngineSpec
from deepring.ipc import codec
from deepring.ipc.messages import Handoff
from deepring.worker.core import WorkerEngine
from deepring.worker.handoff import CacheState, layout_of

SPEC = EngineSpec(model="tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=96)


@pytest.fixture(scope="module")
def llm(deepring_cache_dir):
    return LLM("tiny", max_num_seqs=4, max_model_len=512, max_num_batched_tokens=96)


@pytest.fixture(scope="module")
def engines(deepring_cache_dir):
    return WorkerEngine(SPEC), WorkerEngine(SPEC)


def _prompt(n: int, salt: int = 0) -> list[int]:
    return [(31 * j + 7 * salt) % 120000 + 3 for j in range(n)]


def _prefill(eng: WorkerEngine, rid: int, prompt: list[int], params: SamplingParams):
    req = eng.add(rid, prompt, params, params.seed or 0)
    while not req.output_ids:
        eng.step()
    return req


def _through_the_wire(req, state: CacheState) -> Handoff:
    msg = Handoff(
        rid=req.rid,
        token_ids=np.asarray(req.prompt_ids + req.output_ids, dtype=np.int32),
        prompt_len=len(req.prompt_ids),
        num_cached=req.num_cached,
        cache_hit=0,
        sampling={},
        seed=req.seed,
        decode_gen=1,
        layout=state.layout,
        num_blocks=state.num_blocks,
        slot_state=state.slot_state,
        block_state=state.block_state,
    )
    return codec.decode_strict([bytes(f) for f in codec.encode(msg)])


def _decode(eng: WorkerEngine, req):
    while not req.finished:
        eng.step()
    return req.output_ids


@pytest.mark.parametrize(
    ("n", "params"),
    [
        (200, SamplingParams(temperature=0, max_tokens=12)),  # crosses a block, 3 chunks
        (37, SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=10)),
        (129, SamplingParams(temperature=1.1, top_k=30, seed=3, max_tokens=140)),  # fills blocks
    ],
)
def test_handoff_continues_exactly(engines, llm, n, params):
    pre, dec = engines
    prompt = _prompt(n, salt=n)
    want = llm.generate([prompt], params)[0].token_ids
    req = _prefill(pre, 1, prompt, params)
    assert req.output_ids == want[:1]  # the first token is the prefill worker's
    state = pre.export(req)
    pre.finish(req, "handoff")
    assert pre.blocks.num_used == 0
    assert pre.slots.num_free == pre.slots.num_slots
    # The receiver's slot 0 and first blocks are taken, so the state lands elsewhere.
    busy_slot, busy_blocks = dec.slots.allocate(), dec.blocks.allocate(3)
    try:
        msg = _through_the_wire(req, state)
        got = dec.admit(
            msg.rid,
            msg.token_ids.tolist(),
            msg.prompt_len,
            msg.num_cached,
            params,
            msg.seed,
            CacheState(msg.layout, msg.num_blocks, msg.slot_state, msg.block_state),
        )
        assert got.slot != busy_slot
        assert not set(got.blocks) & set(busy_blocks)
        assert _decode(dec, got) == want
        assert dec.blocks.num_used == 3  # the request's blocks are freed when it ends
    finally:
        dec.slots.free(busy_slot)
        dec.blocks.free(busy_blocks)


def test_a_handoff_that_does_not_fit_is_refused(engines):
    pre, dec = engines
    params = SamplingParams(temperature=0, max_tokens=4)
    req = _prefill(pre, 2, _prompt(50), params)
    state = pre.export(req)
    pre.finish(req, "handoff")
    ids = req.prompt_ids + req.output_ids

    def admit(st: CacheState):
        return dec.admit(2, ids, len(req.prompt_ids), req.num_cached, params, 0, st)

    free = dec.blocks.num_free, dec.slots.num_free
    with pytest.raises(ValueError, match="layout"):
        admit(dataclasses.replace(state, layout="0000000000000000"))
    with pytest.raises(ValueError, match="slot state has"):
        admit(dataclasses.replace(state, slot_state=bytes(state.slot_state)[:-4]))
    with pytest.raises(ValueError, match="cannot fill"):
        admit(dataclasses.replace(state, num_blocks=2))
    assert (dec.blocks.num_free, dec.slots.num_free) == free  # nothing leaked
    assert 2 not in dec.requests


def test_layout_names_the_pool_shape(engines):
    pre, _ = engines
    assert layout_of(pre.pool) == layout_of(pre.pool)
    other = WorkerEngine(dataclasses.replace(SPEC, dtype="bfloat16", max_num_seqs=1))
    assert layout_of(other.pool) != layout_of(pre.pool)
    assert layout_of(None) == "none"


def test_zero_cost_handoff_moves_no_tensors(deepring_cache_dir):
    spec = dataclasses.replace(SPEC, zero_cost=True)
    alone, pre, dec = WorkerEngine(spec), WorkerEngine(spec), WorkerEngine(spec)
    params = SamplingParams(max_tokens=20)
    prompt = _prompt(150)
    want = _decode(alone, alone.add(1, prompt, params, 77))
    req = _prefill(pre, 1, prompt, SamplingParams(max_tokens=20, seed=77))
    state = pre.export(req)
    pre.finish(req, "handoff")
    assert state.layout == "none"
    assert bytes(state.slot_state) == b""
    got = dec.admit(1, req.prompt_ids + req.output_ids, 150, 150, params, 77, state)
    assert _decode(dec, got) == want
    assert len(want) == 20
    assert dec.blocks.num_used == 0
