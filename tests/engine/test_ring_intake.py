"""What a process takes from the rings, without worker processes: the routing-id scheme,
registrations that are refused (names that disagree, junk info, a live worker's name from
another process), load reports and tokens that are refused, the bounded wait of queued
requests, the decode worker's handoff socket taking handoffs only, and random frames of every
kind that raise nothing anywhere."""

from __future__ import annotations

import contextlib
import logging

import msgpack
import numpy as np
import pytest
from deepring.config import EngineSpec, FrontendConfig, WorkerConfig
from deepring.frontend.client import EngineClient
from deepring.ipc import codec, drops
from deepring.ipc.codec import MessageError
from deepring.ipc.drops import DropLog, printable
from deepring.ipc.messages import Handoff, Health, Stats, Tokens
from deepring.ipc.validate import parse_route, worker_route
from hypothesis import HealthCheck, example, given, settings
from ring_frames import VALID, frames, routes

RING = "ipc:///tmp/deepring-test-ring"
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


def _info(role: str, **kw) -> dict:
    info = {
        "role": role,
        "handoff_addr": "ipc:///tmp/deepring-x/handoff-0" if role == "decode" else None,
        "model": "tiny",
        "model_type": "deepseek_v4",
        "random_weights": True,
        "zero_cost": True,
        "max_model_len": 512,
        "vocab_size": 1000,
        "eos_token_ids": [1],
        "num_slots": 4,
        "num_blocks": 40,
        "block_size": 128,
        "tokenizer": None,
    }
    return {**info, **kw}


def _ready(wid: str, gen: int, pid: int = 100, **info) -> Health:
    return Health(
        worker=wid, gen=gen, state="ready", pid=pid, info=_info(wid.split("-")[0], **info)
    )


def _frames(route: bytes, msg) -> list[bytes]:
    return [route, *(bytes(f) for f in codec.encode(msg))]


# A rank's report as worker.ep_rank.EPRank.report makes it (20 rows of factors 1.0 to 2.0).
EP = {"group": 0, "rank": 1, "ranks": 2, "slots": 5, "redundant": 2, "group_steps": 5,
      "rebalances": 1, "balance_rows": 20, "balance_factor": 1.25,
      "balance_factor_sum": 26.0}  # fmt: skip


def _stats(wid: str, gen: int, **kw) -> Stats:
    base = dict(
        waiting=0, running=0, free_slots=4, num_slots=4, used_blocks=0, num_blocks=40,
        queued_tokens=0, steps=1, step_seconds=0.5, compute_seconds=0.4, busy_seconds=0.6,
        generated=3, preemptions=0,
        prefix_cache={"hit_tokens": 0}, dropped={}, step_cost=[0.01, 1e-4, 1e-4, 1e-8, 1e-8],
        backlog_s=0.0, lag_s=0.0, context_tokens=0,
    )  # fmt: skip
    return Stats(worker=wid, gen=gen, **{**base, **kw})


def test_routing_ids_name_the_worker_and_its_incarnation():
    assert worker_route("decode-3", 0xABC) == b"decode-3/abc"
    assert parse_route(b"decode-3/abc") == ("decode-3", 0xABC)
    for bad in (b"decode-3", b"router-1/1", b"decode-3/ABC", b"decode-x/1", b"decode-3/1/2"):
        assert parse_route(bad) is None


def test_printable_never_passes_raw_bytes():
    assert printable(b"decode-0/1f") == "decode-0/1f"
    for raw in (b"\x1b[2Jevil", b"a b", b"\xff" * 40, b""):
        text = printable(raw)
        assert text.startswith("0x")
        assert text.isascii()
        assert text.isprintable()


def test_drops_are_counted_always_and_logged_once_per_interval(caplog):
    now = [0.0]
    counts: dict[str, int] = {}
    d = DropLog(
        logging.getLogger("deepring.test"), "here", counts, interval=10, clock=lambda: now[0]
    )
    with caplog.at_level(logging.WARNING, logger="deepring.test"):
        for _ in range(50):
            d.drop(drops.MALFORMED, b"\x00\x01", "bad \x1b header")
        now[0] = 11.0
        d.drop(drops.MALFORMED, b"peer", "again")
    assert counts == {"malformed": 51}
    lines = caplog.records
    assert len(lines) == 2
    assert "dropped 1 ring message" in lines[0].getMessage()
    assert "dropped 50 ring messages" in lines[1].getMessage()  # 49 quiet ones + this one
    assert "\x1b" not in caplog.text


class Client:
    """An EngineClient without sockets: frames go through its intake and handlers."""

    def __init__(self, **kw) -> None:
        self.c = EngineClient(FrontendConfig(ring_addr=RING, **kw))

    def close(self) -> None:
        self.c.close()

    def feed(self, route: bytes, msg) -> None:
        taken = self.c.intake.accept(_frames(route, msg))
        if taken is not None:
            self.c._handle(*taken)

    @property
    def dropped(self) -> dict[str, int]:
        return self.c.metrics.ring_dropped


@pytest.fixture
def new_client():
    made: list[Client] = []

    def make(**kw) -> Client:
        made.append(Client(**kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_registration_checks_names_roles_and_info(new_client):
    c = new_client()
    bad = [
        (b"decode-0/5", _ready("decode-0", 6)),  # incarnation differs from the routing id
        (b"decode-0/5", _ready("decode-1", 5)),  # worker differs from the routing id
        (b"prefill-0/5", Health("prefill-0", 5, "ready", 9, _info("decode"))),  # role
        (b"decode-0/5", Health("decode-0", 5, "ready", 9, {"role": "decode"})),  # no facts
        (b"decode-0/5", _ready("decode-0", 5, num_slots=-1)),
        (b"decode-0/5", _ready("decode-0", 5, vocab_size="1000")),
        (b"decode-0/5", _ready("decode-0", 5, eos_token_ids=[1, -2])),
        (b"decode-0/5", _ready("decode-0", 5, handoff_addr="http://x")),
        (b"decode-0/5", _ready("decode-0", 5, pid=0)),
        (b"decode-0", _ready("decode-0", 5)),  # the old routing-id scheme
    ]
    for route, msg in bad:
        c.feed(route, msg)
    assert c.c.workers == {}
    assert c.dropped["bad_registration"] == 9
    assert c.dropped["bad_identity"] == 1
    c.feed(b"decode-0/5", _ready("decode-0", 5))
    assert c.c.workers["decode-0"].route == b"decode-0/5"


def test_a_live_workers_name_is_not_taken_over_until_it_is_declared_dead(new_client):
    c = new_client()
    c.feed(b"decode-0/5", _ready("decode-0", 5, pid=100))
    c.feed(b"prefill-0/6", _ready("prefill-0", 6, pid=101))
    real = c.c.workers["decode-0"]
    # Another process claims decode-0: refused, and the real one keeps its requests.
    real.rids.add(42)
    c.feed(b"decode-0/66", _ready("decode-0", 0x66, pid=666))
    assert c.c.workers["decode-0"] is real
    assert c.dropped["identity_in_use"] == 1
    # Its tokens, stats and exit notice are not the registered worker's.
    c.feed(b"decode-0/66", Health("decode-0", 0x66, "exiting", 666, {}))
    c.feed(b"decode-0/66", _stats("decode-0", 0x66, waiting=3))
    assert c.c.workers["decode-0"] is real
    assert real.stats is None
    assert c.dropped["unknown_peer"] == 1
    # The registered one dies (exit, shutdown or silence): now the name is free.
    c.c.worker_lost("decode-0", "exited")
    c.feed(b"decode-0/66", _ready("decode-0", 0x66, pid=666))
    assert c.c.workers["decode-0"].pid == 666


def test_forged_load_reports_are_dropped(new_client):
    c = new_client()
    c.feed(b"decode-0/5", _ready("decode-0", 5))
    w = c.c.workers["decode-0"]
    forged = [
        _stats("decode-0", 5, waiting=-5),
        _stats("decode-0", 5, free_slots=9),
        _stats("decode-0", 5, used_blocks=41),
        _stats("decode-0", 5, step_seconds=float("nan")),
        _stats("decode-0", 5, generated=2**60),
        _stats("decode-0", 5, prefix_cache={'x{a="b"} 1\nevil': 1}),  # metric injection
        _stats("decode-0", 5, prefix_cache={"hit_tokens": "many"}),
        _stats("decode-0", 5, prefix_cache={"hit_tokens": True}),
        _stats("decode-0", 5, dropped={"malformed": -1}),
        _stats("decode-0", 5, step_cost=[0.01, 1e-4, 1e-4, 1e-8]),  # a coefficient short
        _stats("decode-0", 5, step_cost=[0.01, -1e-4, 1e-4, 1e-8, 0.0]),
        _stats("decode-0", 5, step_cost=[0.01, float("inf"), 1e-4, 1e-8, 0.0]),
        _stats("decode-0", 5, step_cost=[0.01, "1e-4", 1e-4, 1e-8, 0.0]),
        _stats("decode-0", 5, backlog_s=float("nan")),
        _stats("decode-0", 5, backlog_s=-1.0),
        _stats("decode-0", 5, lag_s=float("inf")),
        _stats("decode-0", 5, context_tokens=-3),
        _stats("decode-1", 5),
        # An expert-parallel rank's report: every key, counts, a factor in [1, ranks], and a
        # factor sum between the rows counted and ranks times that.
        _stats("decode-0", 5, expert_parallel={**EP, "balance_factor": 0.5}),
        _stats("decode-0", 5, expert_parallel={**EP, "balance_factor": 2.5}),
        _stats("decode-0", 5, expert_parallel={**EP, "balance_factor": float("nan")}),
        _stats("decode-0", 5, expert_parallel={**EP, "balance_factor_sum": 10.0}),
        _stats("decode-0", 5, expert_parallel={**EP, "balance_factor_sum": 41.0}),
        _stats("decode-0", 5, expert_parallel={**EP, "rank": 2}),
        _stats("decode-0", 5, expert_parallel={**EP, "rebalances": -1}),
        _stats("decode-0", 5, expert_parallel={**EP, "slots": "4"}),
        _stats("decode-0", 5, expert_parallel={**EP, 'x{a="b"} 1\nevil': 1}),
        _stats("decode-0", 5, expert_parallel={k: v for k, v in EP.items() if k != "group"}),
    ]
    for s in forged:
        c.feed(b"decode-0/5", s)
    assert w.stats is None
    assert c.dropped["bad_stats"] == len(forged)
    good = _stats("decode-0", 5, waiting=2, prefix_cache={"hit_tokens": 128, "host_bytes": 1.5})
    c.feed(b"decode-0/5", good)
    assert w.stats is not None
    assert w.stats.waiting == 2
    c.feed(b"decode-0/5", _stats("decode-0", 5, expert_parallel=EP))
    assert w.stats.expert_parallel == EP


def test_tokens_must_line_up_and_stay_within_the_vocabulary(new_client):
    c = new_client()
    c.feed(b"decode-0/5", _ready("decode-0", 5))

    def tokens(**kw) -> Tokens:
        base = dict(worker="decode-0", rids=[1], offsets=[0], counts=[1],
                    token_ids=np.array([5], dtype=np.int32), finished=[], cache_hits=[],
                    errors=[])  # fmt: skip
        return Tokens(**{**base, **kw})

    bad = [
        tokens(counts=[2]),
        tokens(rids=[1, 2]),
        tokens(rids=[-1]),
        tokens(token_ids=np.array([1000], dtype=np.int32)),
        tokens(token_ids=np.array([-3], dtype=np.int32)),
        tokens(finished=[[1, "explode", 1]]),
        tokens(finished=[[1, "stop"]]),
        tokens(errors=[[1, 2]]),
        tokens(cache_hits=[["1", 0]]),
        tokens(worker="decode-1"),
    ]
    for t in bad:
        c.feed(b"decode-0/5", t)
    assert c.dropped["bad_tokens"] == len(bad)


def test_log_probabilities_must_line_up_and_be_log_probabilities(new_client):
    c = new_client()
    c.feed(b"decode-0/5", _ready("decode-0", 5))
    f32 = np.float32

    def tokens(**kw) -> Tokens:
        base = dict(worker="decode-0", rids=[1, 2], offsets=[0, 0], counts=[2, 1],
                    token_ids=np.array([5, 6, 7], dtype=np.int32), finished=[], cache_hits=[],
                    errors=[], logprob_k=[1, -1], logprobs=np.array([-0.5, -1.0], f32),
                    top_ids=np.array([5, 9], dtype=np.int32),
                    top_logprobs=np.array([-0.5, -0.75], f32))  # fmt: skip
        return Tokens(**{**base, **kw})

    bad = [
        tokens(logprob_k=[1]),
        tokens(logprob_k=[21, -1]),
        tokens(logprob_k=[-2, -1]),
        tokens(logprob_k=[True, -1]),
        tokens(logprob_k=[2, -1]),  # 2 alternatives per token, but only 2 in all
        tokens(logprob_k=[1, 0]),  # request 2's logprob is missing
        tokens(logprobs=np.array([-0.5], f32)),
        tokens(logprobs=np.array([-0.5, 0.5], f32)),
        tokens(logprobs=np.array([-0.5, np.nan], f32)),
        tokens(top_logprobs=np.array([-0.5, -np.inf], f32)),
        tokens(top_logprobs=np.array([-0.5, -10000.0], f32)),
        tokens(top_ids=np.array([5, 1000], dtype=np.int32)),
        tokens(top_ids=np.array([5, -1], dtype=np.int32)),
        tokens(logprob_k=[], logprobs=np.array([-0.5], f32)),
    ]
    for t in bad:
        c.feed(b"decode-0/5", t)
    assert c.dropped["bad_tokens"] == len(bad)
    c.feed(b"decode-0/5", tokens())
    none = {"logprobs": np.zeros(0, f32), "top_logprobs": np.zeros(0, f32)}
    c.feed(b"decode-0/5", tokens(logprob_k=[], top_ids=np.zeros(0, np.int32), **none))
    assert c.dropped["bad_tokens"] == len(bad)


class Sink:
    def __init__(self) -> None:
        self.errors: list = []

    def start(self, cache_hit: int) -> None:
        raise AssertionError("no worker: nothing can start")

    def tokens(self, ids, finish, logprobs=None) -> bool:
        raise AssertionError("no worker: no tokens")

    def error(self, message: str, status: int = 500) -> None:
        self.errors.append((status, message))


def test_a_queued_request_fails_with_503_after_the_queue_timeout(new_client):
    from deepring.sampling.params import SamplingParams

    c = new_client(queue_timeout=5.0)
    sink = Sink()
    rid = c.c.submit([1, 2, 3], SamplingParams(max_tokens=2), 0, sink)
    st_ = c.c.requests[rid]
    c.c._expire_queued(st_.arrival + 4.9)
    assert sink.errors == []
    c.c._expire_queued(st_.arrival + 5.1)
    assert sink.errors == [
        (503, "the request waited 5s and no prefill or decode worker is available; retry later")
    ]
    assert c.c.requests == {}
    assert c.c.queued == 0
    # With both roles up but no room, it says so.
    c.feed(b"decode-0/5", _ready("decode-0", 5))
    c.feed(b"prefill-0/6", _ready("prefill-0", 6))
    c.c.registry.workers["decode-0"].load.ready = False
    sink = Sink()
    rid = c.c.submit([1, 2, 3], SamplingParams(max_tokens=2), 0, sink)
    c.c._expire_queued(c.c.requests[rid].arrival + 6)
    assert sink.errors[0][0] == 503
    assert "no decode worker is available" in sink.errors[0][1]


def test_tokens_for_another_workers_request_are_ignored(new_client):
    from deepring.sampling.params import SamplingParams

    c = new_client()
    c.feed(b"decode-0/5", _ready("decode-0", 5))
    c.feed(b"decode-1/7", _ready("decode-1", 7))
    c.feed(b"prefill-0/6", _ready("prefill-0", 6))
    sink = Sink()
    rid = c.c.submit([1, 2, 3], SamplingParams(max_tokens=2), 0, sink)
    st_ = c.c.requests[rid]
    other = next(w for w in ("decode-0", "decode-1") if w != st_.decode)
    route = c.c.workers[other].route
    err = Tokens(other, [], [], [], np.zeros(0, np.int32), [], [], [[rid, "I say it failed"]])
    c.feed(route, err)
    assert sink.errors == []
    assert rid in c.c.requests


@pytest.fixture(scope="module")
def fuzz_client():
    """One frontend for every example: junk must leave its registered workers as they are."""
    c = Client()
    c.feed(b"decode-0/3", _ready("decode-0", 3))
    c.feed(b"prefill-0/1", _ready("prefill-0", 1))
    yield c
    c.close()


@FUZZ
@given(route=routes, message=frames)
@example(route=b"decode-0/3", message=[b"\x81\x90\x00"])
def test_random_frames_raise_nothing_in_the_codec_or_the_frontend(fuzz_client, route, message):
    with contextlib.suppress(MessageError):
        codec.decode_strict(message)
    c = fuzz_client
    taken = c.c.intake.accept([route, *message])
    if taken is not None:
        c.c._handle(*taken)
    # A frame set without its routing id, as a broken ROUTER peer could leave it.
    c.c.intake.accept(message[:1])
    assert set(c.c.workers) == {"decode-0", "prefill-0"}
    assert c.c.workers["decode-0"].route == b"decode-0/3"


@pytest.fixture(scope="module")
def decode_link(tmp_path_factory):
    from deepring.worker.process import WorkerLink

    root = tmp_path_factory.mktemp("link")
    cfg = WorkerConfig(
        role="decode",
        index=0,
        frontend_addrs=(f"ipc://{root}/ring",),
        handoff_bind=f"ipc://{root}/handoff",
        engine=EngineSpec(zero_cost=True),
    )
    link = WorkerLink(cfg, gen=3)
    yield link, cfg
    link.close()


def test_the_handoff_socket_takes_handoffs_and_nothing_else(decode_link):
    import time

    import zmq

    link, cfg = decode_link
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.linger = 0
    push.connect(cfg.handoff_bind)
    try:
        handoff = VALID[1]
        sent = [
            [b"abc"],  # the 3-byte frame that once made the worker exit 1
            [msgpack.packb({"t": "shutdown", "v": 1, "drain": False, "timeout": 0.0})],
            [bytes(f) for f in codec.encode(Health("frontend", 1, "announce", 1, {}))],
            [bytes(f) for f in codec.encode(VALID[3])],  # an Abort
            [b"\x81\x90\x00"],
            [bytes(f) for f in codec.encode(handoff)],
        ]
        for f in sent:
            push.send_multipart(f)
        got: list = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got += link.poll(0.1)[0]
        assert len(got) == 1
        source, msg = got[0]
        assert source == -1
        assert isinstance(msg, Handoff)
        assert link.drops.counts == {"malformed": 2, "unexpected": 3}
    finally:
        push.close()
        ctx.term()


@FUZZ
@given(message=frames)
def test_random_frames_raise_nothing_in_a_worker(decode_link, message):
    link, _ = decode_link
    from deepring.worker.process import _FROM_PREFILL

    msg = link._accept(message, _FROM_PREFILL, "fuzz")
    assert msg is None or isinstance(msg, Handoff)


class RecordingSink(Sink):
    def __init__(self) -> None:
        super().__init__()
        self.got: list = []

    def start(self, cache_hit: int) -> None:
        pass

    def tokens(self, ids, finish, logprobs=None) -> bool:
        self.got.append((ids, finish, logprobs))
        return False


def test_log_probabilities_reach_the_sink_with_their_tokens_in_order(new_client):
    from deepring.sampling.params import SamplingParams

    c = new_client()
    c.feed(b"decode-0/5", _ready("decode-0", 5))
    c.feed(b"prefill-0/6", _ready("prefill-0", 6))
    f32 = np.float32
    sinks, rids = [], []
    for k in (1, None):
        sinks.append(RecordingSink())
        rids.append(c.c.submit([1, 2, 3], SamplingParams(max_tokens=4, logprobs=k), 0, sinks[-1]))
        st_ = c.c.requests[rids[-1]]
        st_.prefill, st_.decode, st_.stage = "prefill-0", "decode-0", "decode"  # as if sent
    a, b = rids
    # Offsets 1..2 of request a arrive before offset 0; request b asked for none.
    late = Tokens("decode-0", [a, b], [1, 0], [2, 1], np.array([11, 12, 40], np.int32), [], [],
                  [], [1, -1], np.array([-1.0, -2.0], f32), np.array([11, 3], np.int32),
                  np.array([-1.0, -0.5], f32))  # fmt: skip
    lp = np.array([-0.25], f32)
    first = Tokens("decode-0", [a], [0], [1], np.array([10], np.int32), [], [], [], [1], lp,
                   np.array([10], np.int32), lp)  # fmt: skip
    c.feed(b"decode-0/5", late)
    c.c._deliver()
    c.feed(b"decode-0/5", first)
    c.c._deliver()
    assert sinks[0].got == [
        ([10, 11, 12], None, [(-0.25, [(10, -0.25)]), (-1.0, [(11, -1.0)]), (-2.0, [(3, -0.5)])])
    ]
    assert sinks[1].got == [([40], None, None)]
    # Tokens without the log probabilities their request asked for fail it, loudly.
    bare = Tokens("decode-0", [a], [3], [1], np.array([13], np.int32), [], [], [])
    c.feed(b"decode-0/5", bare)
    assert len(sinks[0].errors) == 1
    assert "log probabilities" in sinks[0].errors[0][1]
    assert a not in c.c.requests
