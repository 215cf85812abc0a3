"""Hypothesis strategies for hostile ring traffic: random bytes, random msgpack values, maps
with valid or random type tags and fields of random types, valid messages with one field
broken or missing, and any of these with too few or too many payload frames."""

from __future__ import annotations

import msgpack
import numpy as np
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
from hypothesis import strategies as st

TAGS = [cls.TYPE for cls in MESSAGE_TYPES]

# Every message type once, well formed (the templates the mutations start from).
VALID = [
    Submit(
        rid=7,
        prompt_ids=np.array([1, 2, 3], dtype=np.int32),
        sampling=SamplingParams(temperature=0.0, max_tokens=4),
        seed=1,
        decode_worker="decode-0",
        decode_gen=3,
        decode_addr="ipc:///tmp/none",
        cache_class="chat",
        num_output=0,
    ),
    Handoff(
        rid=7,
        frontend_gen=11,
        token_ids=np.array([1, 2, 3, 4], dtype=np.int32),
        prompt_len=3,
        num_cached=3,
        cache_hit=0,
        sampling=SamplingParams(temperature=0.0, max_tokens=4),
        seed=1,
        decode_gen=3,
        cache_class="chat",
        slot_state=b"\x00" * 64,
        block_state=b"\x00" * 64,
    ),
    Tokens(
        worker="decode-0",
        rids=[7],
        offsets=[0],
        counts=[1],
        token_ids=np.array([5], dtype=np.int32),
        finished=[[7, "length", 1]],
        cache_hits=[],
        errors=[],
    ),
    Abort(rids=[7], reason="x"),
    Health(worker="decode-0", gen=3, state="ready", pid=1, info={"role": "decode"}),
    Stats(
        worker="decode-0",
        gen=3,
        waiting=-5,
        running=0,
        free_slots=1,
        num_slots=1,
        used_blocks=0,
        num_blocks=1,
        queued_tokens=0,
        steps=0,
        step_seconds=0.0,
        compute_seconds=0.0,
        busy_seconds=0.0,
        generated=0,
        preemptions=0,
        prefix_cache={},
        dropped={},
        step_cost=[0.0] * 5,
        backlog_s=0.0,
        lag_s=0.0,
        context_tokens=0,
    ),
    Shutdown(drain=False, timeout=0.0),
    Tokens(
        worker="decode-0",
        rids=[7, 8],
        offsets=[1, 0],
        counts=[2, 1],
        token_ids=np.array([5, 6, 9], dtype=np.int32),
        finished=[],
        cache_hits=[],
        errors=[],
        logprob_k=[1, -1],
        logprobs=np.array([-0.25, -3.0], dtype=np.float32),
        top_ids=np.array([5, 6], dtype=np.int32),
        top_logprobs=np.array([-0.25, -3.0], dtype=np.float32),
    ),
]
HEADERS = [msgpack.unpackb(codec.encode(m)[0]) for m in VALID]
PAYLOADS = [[bytes(f) for f in codec.encode(m)[1:]] for m in VALID]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_subnormal=False),  # the engine tests flush denormals
    st.text(max_size=16),
    st.binary(max_size=16),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
payload = st.lists(st.binary(max_size=48), max_size=3)


@st.composite
def mutated(draw) -> list[bytes]:
    """A valid message's header with one field replaced by a random value (or removed, or an
    unknown one added), and its payload frames, too few, too many or random."""
    i = draw(st.integers(0, len(VALID) - 1))
    header = dict(HEADERS[i])
    name = draw(st.sampled_from(sorted(header)))
    action = draw(st.sampled_from(["replace", "remove", "add"]))
    if action == "replace":
        header[name] = draw(values)
    elif action == "remove":
        del header[name]
    else:
        header[draw(st.text(max_size=8))] = draw(values)
    frames = draw(st.sampled_from([PAYLOADS[i], PAYLOADS[i][:-1], [*PAYLOADS[i], b"x"]]))
    frames = draw(st.just(frames) | payload)
    return [msgpack.packb(header, use_bin_type=True), *frames]


@st.composite
def random_map(draw) -> list[bytes]:
    """A msgpack map with a valid or random type tag and version, and random fields."""
    header = draw(st.dictionaries(st.text(max_size=12), values, max_size=8))
    header["t"] = draw(st.sampled_from(TAGS) | st.text(max_size=8) | values)
    header["v"] = draw(st.sampled_from([1, 2, 3, 1.0, True]) | values)
    return [msgpack.packb(header, use_bin_type=True), *draw(payload)]


# One frame set as a peer could send it (without the routing id a ROUTER adds).
frames = st.one_of(
    st.lists(st.binary(max_size=64), max_size=4),
    values.map(lambda v: [msgpack.packb(v, use_bin_type=True)]),
    random_map(),
    mutated(),
    st.sampled_from(
        [
            [b"\x81\x90\x00"],  # a map keyed by an array: unhashable
            [b"\x81\x80\x00"],  # a map keyed by a map
            [b"\xc1"],  # a reserved byte
            [b"abc"],
            [msgpack.packb({"t": "shutdown", "v": 1, "drain": False, "timeout": 0.0})],
            [msgpack.packb({**HEADERS[4], "state": "announce"})],
        ]
    ),
)
routes = st.sampled_from(
    [b"decode-0/3", b"prefill-0/1", b"decode-7/abc", b"decode-0", b"\xff\x00\x1b[2J", b""]
) | st.binary(min_size=1, max_size=24)
