"""Ring messages: every type round-trips through its frames; anything else is dropped, not
raised."""

from __future__ import annotations

import dataclasses
import logging

import msgpack
import numpy as np
import pytest
from deepring.ipc import codec
from deepring.ipc.messages import (
    MESSAGE_TYPES,
    Abort,
    Handoff,
    Health,
    Shutdown,
    Stats,
    Submit,
    Tokens,
)
from deepring.sampling.params import SamplingParams

SAMPLES = [
    Submit(
        rid=7,
        prompt_ids=np.array([0, 128803, 6366, 128804], dtype=np.int32),
        sampling=SamplingParams(temperature=0.7, top_p=0.95, max_tokens=64),
        seed=2**63 - 1,
        decode_worker="decode-1",
        decode_gen=123456789,
        decode_addr="ipc:///tmp/deepring-x/handoff-1",
        cache_class="agent",
        num_output=2,
    ),
    Handoff(
        rid=2**40 + 3,
        frontend_gen=2**62,
        token_ids=np.arange(300, dtype=np.int32),
        prompt_len=299,
        num_cached=299,
        cache_hit=128,
        sampling=SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=(1, 2), seed=9),
        seed=5,
        decode_gen=9,
        cache_class="chat",
        slot_state=bytes(range(256)) * 4,
        block_state=b"\x00\xff" * 1000,
    ),
    Tokens(
        worker="decode-0",
        rids=[1, 2, 3],
        offsets=[0, 5, 17],
        counts=[1, 2, 1],
        token_ids=np.array([11, 12, 13, 14], dtype=np.int32),
        finished=[[2, "length", 7]],
        cache_hits=[[1, 0]],
        errors=[[9, "request rejected: too long"]],
    ),
    Abort(rids=[1, 2, 3], reason="client disconnected"),
    Health(
        worker="prefill-0",
        gen=42,
        state="ready",
        pid=1234,
        info={"max_model_len": 4096, "eos_token_ids": [1], "tokenizer": None},
    ),
    Stats(
        worker="decode-0",
        gen=42,
        waiting=1,
        running=2,
        free_slots=3,
        num_slots=5,
        used_blocks=6,
        num_blocks=7,
        queued_tokens=8,
        steps=9,
        step_seconds=1.5,
        compute_seconds=0.0,
        busy_seconds=0.0,
        generated=10,
        preemptions=11,
        prefix_cache={"hit_tokens": 128, "store_directory_errors": 0},
        dropped={"malformed": 3},
        step_cost=[0.01, 2e-4, 5e-5, 1e-8, 1.3e-8],
        backlog_s=2.5,
        lag_s=0.01,
        context_tokens=12,
        expert_parallel={"group": 1, "rank": 0, "ranks": 4, "balance_factor": 1.125},
    ),
    Shutdown(drain=True, timeout=30.0),
    Tokens(
        worker="prefill-1",
        rids=[4, 5, 6],
        offsets=[0, 3, 0],
        counts=[2, 1, 1],
        token_ids=np.array([21, 22, 23, 24], dtype=np.int32),
        finished=[],
        cache_hits=[[4, 128]],
        errors=[],
        logprob_k=[2, -1, 0],  # 2 alternatives; none asked; the sampled token's only
        logprobs=np.array([-0.5, -1.25, -9999.0], dtype=np.float32),
        top_ids=np.array([21, 7, 22, 8], dtype=np.int32),
        top_logprobs=np.array([-0.5, -2.0, -1.25, -1.5], dtype=np.float32),
    ),
]


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (bytes, bytearray, memoryview)):
        return bytes(a) == bytes(b)
    return a == b


def test_every_message_type_has_a_sample():
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.TYPE)
def test_round_trip(msg):
    frames = codec.encode(msg)
    payloads = [f for f in dataclasses.fields(msg) if "frame" in f.metadata]
    assert len(frames) == 1 + len(payloads)
    # As received from a socket: plain bytes per frame.
    back = codec.decode_strict([bytes(f) for f in frames])
    assert type(back) is type(msg)
    for f in dataclasses.fields(msg):
        assert _same(getattr(back, f.name), getattr(msg, f.name)), f.name
    header = msgpack.unpackb(frames[0])
    assert header["t"] == msg.TYPE
    assert header["v"] == msg.VERSION
    for f in payloads:  # payloads travel as frames, never inside the msgpack header
        assert f.name not in header


def test_token_ids_travel_as_raw_int32():
    msg = SAMPLES[0]
    frames = codec.encode(msg)
    assert bytes(frames[1]) == np.asarray(msg.prompt_ids, dtype="<i4").tobytes()
    # Lists of ints are accepted on the way out too.
    lst = dataclasses.replace(msg, prompt_ids=[5, 6, 7])
    assert codec.decode_strict(codec.encode(lst)).prompt_ids.tolist() == [5, 6, 7]


def _header(msg) -> dict:
    return msgpack.unpackb(codec.encode(msg)[0])


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([], "empty"),
        ([b"\xc1"], "undecodable"),
        ([msgpack.packb([1, 2])], "not a map"),
        ([msgpack.packb({"t": "teleport", "v": 1})], "unknown message type"),
        ([msgpack.packb({**_header(SAMPLES[3]), "v": 2})], "schema version 2"),
        ([msgpack.packb({"t": "abort", "v": 1, "rids": [1]})], "missing field 'reason'"),
        ([msgpack.packb({"t": "abort", "v": 1, "rids": 5, "reason": "x"})], "expected list"),
        ([msgpack.packb({**_header(SAMPLES[5]), "gen": True})], "expected int"),
        ([msgpack.packb({**_header(SAMPLES[0]), "sampling": 3})], "expected dict"),
        (
            [msgpack.packb({**_header(SAMPLES[0]), "sampling": {"temprature": 1.0}}), b""],
            "unknown sampling fields",
        ),
        (
            [msgpack.packb({**_header(SAMPLES[0]), "sampling": {"max_tokens": "5"}}), b""],
            "bad sampling parameter max_tokens",
        ),
        (
            [msgpack.packb({**_header(SAMPLES[0]), "sampling": {"top_p": 0.0}}), b""],
            "top_p must be in",
        ),
        ([codec.encode(SAMPLES[0])[0]], "0 payload frames, expected 2"),
        ([codec.encode(SAMPLES[0])[0], b"\x01\x02\x03", b""], "not a whole int32 array"),
    ],
)
def test_bad_messages_are_logged_and_dropped(frames, match, caplog):
    with pytest.raises(codec.MessageError, match=match):
        codec.decode_strict(frames)
    with caplog.at_level(logging.WARNING, logger="deepring.ipc"):
        assert codec.decode(frames, "test-peer") is None
    assert "test-peer" in caplog.text
    assert match.split("'")[0] in caplog.text


def test_sampling_travels_as_a_typed_map():
    header = _header(SAMPLES[1])
    assert header["sampling"]["stop_token_ids"] == [1, 2]
    back = codec.decode_strict([bytes(f) for f in codec.encode(SAMPLES[1])])
    assert back.sampling == SAMPLES[1].sampling
    # A sender's integer temperature is a float once read.
    raw = {**header, "sampling": {**header["sampling"], "temperature": 1}}
    frames = [msgpack.packb(raw), *codec.encode(SAMPLES[1])[1:]]
    got = codec.decode_strict([bytes(f) for f in frames]).sampling
    assert got.temperature == 1.0
    assert isinstance(got.temperature, float)


def test_float_fields_accept_integers_on_the_wire():
    raw = msgpack.packb({"t": "shutdown", "v": 1, "drain": False, "timeout": 3})
    msg = codec.decode_strict([raw])
    assert msg.timeout == 3.0
    assert isinstance(msg.timeout, float)
