"""Prefill -> decode handoff: a request prefilled in one worker's pool and continued in
another's (different slot, different blocks, through the wire format) generates exactly what
one engine generates alone; a record that does not fit the pool, or was damaged, is refused
without leaking anything."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from deepring import LLM, SamplingParams
from deepring.cache.transfer import HEADER_BYTES, NO_TENSORS, CacheState, fingerprint
from deepring.config import EngineSpec
from deepring.core.build import build_engine
from deepring.core.engine import EngineCore
from deepring.ipc import codec
from deepring.ipc.messages import Handoff

SPEC = EngineSpec(model="tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=96)


@pytest.fixture(scope="module")
def llm(deepring_cache_dir):
    return LLM("tiny", max_num_seqs=4, max_model_len=512, max_num_batched_tokens=96)


@pytest.fixture(scope="module")
def engines(deepring_cache_dir):
    return build_engine(SPEC).engine, build_engine(SPEC).engine


def _prompt(n: int, salt: int = 0) -> list[int]:
    return [(31 * j + 7 * salt) % 120000 + 3 for j in range(n)]


def _prefill(eng: EngineCore, rid: int, prompt: list[int], params: SamplingParams):
    req = eng.add(rid, prompt, params, params.seed or 0)
    while not req.output_ids:
        eng.step()
    return req


def _through_the_wire(req, state: CacheState) -> Handoff:
    msg = Handoff(
        rid=req.rid,
        frontend_gen=0,
        token_ids=np.asarray(req.prompt_ids + req.output_ids, dtype=np.int32),
        prompt_len=len(req.prompt_ids),
        num_cached=req.num_cached,
        cache_hit=0,
        sampling=req.params,
        seed=req.seed,
        decode_gen=1,
        cache_class="chat",
        slot_state=state.slot_state,
        block_state=state.block_state,
    )
    return codec.decode_strict([bytes(f) for f in codec.encode(msg)])


def _decode(eng: EngineCore, req):
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
            msg.sampling,
            msg.seed,
            CacheState(msg.slot_state, msg.block_state),
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
    fp_at = 4 + 2 + 1  # magic, format version, kind: then the layout fingerprint

    def damaged(buf, at: int) -> bytes:
        b = bytearray(buf)
        b[at] ^= 0xFF
        return bytes(b)

    with pytest.raises(ValueError, match="layout"):
        admit(dataclasses.replace(state, block_state=damaged(state.block_state, fp_at)))
    with pytest.raises(ValueError, match="checksum"):
        admit(dataclasses.replace(state, slot_state=damaged(state.slot_state, HEADER_BYTES + 9)))
    with pytest.raises(ValueError, match="payload bytes"):
        admit(dataclasses.replace(state, slot_state=bytes(state.slot_state)[:-4]))
    with pytest.raises(ValueError, match="not a cache state record"):
        admit(dataclasses.replace(state, slot_state=damaged(state.slot_state, 0)))
    other = pre.export(_prefill(pre, 3, _prompt(300), params))  # 3 blocks, not 1
    pre.abort(3)
    with pytest.raises(ValueError, match="cannot fill"):
        admit(dataclasses.replace(state, block_state=other.block_state))
    assert (dec.blocks.num_free, dec.slots.num_free) == free  # nothing leaked
    assert 2 not in dec.requests


def test_fingerprint_names_the_pool_shape(engines):
    pre, _ = engines
    assert fingerprint(pre.pool) == fingerprint(pre.pool)
    other = build_engine(dataclasses.replace(SPEC, dtype="bfloat16", max_num_seqs=1)).engine
    assert fingerprint(other.pool) != fingerprint(pre.pool)
    assert fingerprint(None) == NO_TENSORS


def test_zero_cost_handoff_moves_no_tensors(deepring_cache_dir):
    spec = dataclasses.replace(SPEC, zero_cost=True)
    alone, pre, dec = (build_engine(spec).engine for _ in range(3))
    params = SamplingParams(max_tokens=20)
    prompt = _prompt(150)
    want = _decode(alone, alone.add(1, prompt, params, 77))
    req = _prefill(pre, 1, prompt, SamplingParams(max_tokens=20, seed=77))
    state = pre.export(req)
    pre.finish(req, "handoff")
    assert len(state.slot_state) == len(state.block_state) == HEADER_BYTES  # headers only
    got = dec.admit(1, req.prompt_ids + req.output_ids, 150, 150, params, 77, state)
    assert _decode(dec, got) == want
    assert len(want) == 20
    assert dec.blocks.num_used == 0
