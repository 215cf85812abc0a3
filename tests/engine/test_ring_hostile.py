"""Hostile peers on a real tcp:// ring secured with CURVE: the frontend's EngineClient in this
process, a zero-cost prefill and decode worker as supervised child processes, and ZeroMQ
sockets of the test playing the intruder.

A peer without the ring's keys (plain, or with a key of its own) gets no connection at all; a
peer with them (a compromised host) cannot take over a live worker's name, cannot stop or
confuse the decode worker through its handoff port, and random frames of every kind on both
sockets crash nothing: the same request is served the same way before and after.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import msgpack
import pytest
import zmq
from deepring.config import EngineSpec, FrontendConfig, WorkerConfig
from deepring.frontend.client import EngineClient
from deepring.ipc import codec, ring_keys
from deepring.ipc.messages import Health, Submit
from deepring.launcher import Supervisor
from deepring.sampling.params import SamplingParams
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loop_thread import LoopThread
from ring_frames import frames as any_frames

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE"),
]

# Paced steps: a long request is still streaming when the intruder acts.
SPEC = EngineSpec(
    zero_cost=True, zero_cost_step_ms=5.0, max_model_len=512, max_num_seqs=4, prefix_cache=False
)
PARAMS = SamplingParams(temperature=0, max_tokens=12)


def _tcp() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class Collect:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ids: list[int] = []
        self.done: asyncio.Future = loop.create_future()

    def start(self, cache_hit: int) -> None:
        pass

    def tokens(self, ids: list[int], finish: str | None, logprobs=None) -> bool:
        self.ids += ids
        if finish is not None:
            self.done.set_result(("finished", finish))
        return False

    def error(self, message: str, status: int = 500) -> None:
        self.done.set_result(("error", message))


class SecureRing(LoopThread):
    def __init__(self, root) -> None:
        super().__init__()
        self.keys_dir = root / "keys"
        ring_keys.generate(self.keys_dir)
        self.keys = ring_keys.load(self.keys_dir)
        self.handoff = _tcp()
        self.fe = FrontendConfig(
            ring_addr=_tcp(),
            heartbeat_interval=0.5,
            heartbeat_timeout=20.0,
            ring_keys=str(self.keys_dir),
        )
        common = {
            "frontend_addrs": (self.fe.ring_addr,),
            "parent_pid": os.getpid(),
            "heartbeat_interval": 0.5,
            "heartbeat_timeout": 20.0,
            "ring_keys": str(self.keys_dir),
        }
        self.workers = (
            WorkerConfig(role="prefill", index=0, engine=SPEC, **common),
            WorkerConfig(role="decode", index=0, engine=SPEC, handoff_bind=self.handoff, **common),
        )
        self.fatal: list[str] = []
        self.call(self._start)
        self.run(self.client.wait_ready(), timeout=180)
        self.ctx = zmq.Context()
        self.peers: list[zmq.Socket] = []

    def _start(self) -> None:
        self.client = EngineClient(self.fe)
        self.client.start(self.loop)
        self.supervisor = Supervisor(self.workers, self.client, self.fatal.append)
        self.supervisor.start()

    def submit(self, params: SamplingParams = PARAMS) -> Collect:
        def go() -> Collect:
            sink = Collect(self.loop)
            self.client.submit([5, 6, 7, 8], params, 0, sink)
            return sink

        return self.call(go)

    def generate(self, params: SamplingParams = PARAMS):
        sink = self.submit(params)

        async def wait():
            return await sink.done

        return self.run(wait(), 60), sink.ids

    def registered(self) -> dict[str, tuple[int, bytes]]:
        return self.call(lambda: {w.id: (w.pid, w.route) for w in self.client.workers.values()})

    def socket(self, kind: int, addr: str, identity: bytes | None = None, keys=None) -> zmq.Socket:
        """A peer of the test's: keys (public, secret) make it a CURVE client."""
        s = self.ctx.socket(kind)
        s.linger = 0
        if identity is not None:
            s.identity = identity
        if keys is not None:
            s.curve_serverkey = self.keys.server_public
            s.curve_publickey, s.curve_secretkey = keys
        s.connect(addr)
        self.peers.append(s)  # closed with the ring (a socket collected unclosed warns)
        return s

    @property
    def member_keys(self) -> tuple[bytes, bytes]:
        return self.keys.client_public, self.keys.client_secret

    def close(self) -> None:
        for p in self.peers:
            p.close(linger=0)
        self.ctx.term()
        self.run(self.supervisor.stop(timeout=10))
        self.call(self.client.close)
        self.stop()


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    r = SecureRing(tmp_path_factory.mktemp("secure-ring"))
    yield r
    r.close()
    assert not r.fatal


@pytest.fixture(scope="module")
def baseline(ring):
    return ring.generate()


def _ready_from(ring: SecureRing, wid: str, gen: int) -> list[bytes]:
    """A registration as convincing as can be: the real worker's own facts."""
    info = ring.call(lambda: dict(ring.client.workers["decode-0"].info))
    info["role"] = wid.split("-")[0]
    return [bytes(f) for f in codec.encode(Health(wid, gen, "ready", 4242, info))]


def _nothing_but_announces(sock: zmq.Socket, seconds: float = 1.0) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000)):
            msg = codec.decode_strict(sock.recv_multipart())
            assert isinstance(msg, Health), f"an intruder received a {msg.TYPE} message"


def _decode_drops(ring: SecureRing) -> dict:
    def get() -> dict:
        s = ring.client.workers["decode-0"].stats
        return dict(s.dropped) if s is not None else {}

    return ring.call(get)


def test_peers_without_the_ring_keys_get_nothing_in(ring, baseline):
    before = ring.registered()
    denied = ring.call(lambda: ring.client.security.denied)
    drops = _decode_drops(ring)
    plain = ring.socket(zmq.DEALER, ring.fe.ring_addr, b"prefill-1/1")
    stranger = ring.socket(zmq.DEALER, ring.fe.ring_addr, b"prefill-1/2", zmq.curve_keypair())
    ho_plain = ring.socket(zmq.PUSH, ring.handoff)
    ho_stranger = ring.socket(zmq.PUSH, ring.handoff, keys=zmq.curve_keypair())
    for sock, gen in ((plain, 1), (stranger, 2)):
        sock.send_multipart(_ready_from(ring, "prefill-1", gen))
    stop = msgpack.packb({"t": "shutdown", "v": 1, "drain": False, "timeout": 0.0})
    for sock in (ho_plain, ho_stranger):
        for frames in ([stop], [b"abc"]):
            sock.send_multipart(frames)
    # While they knock, requests are served as before; no intruder hears of them.
    assert ring.generate() == baseline
    for sock in (plain, stranger):
        assert not sock.poll(1000)
    assert ring.registered() == before
    assert ring.call(lambda: ring.client.security.denied) > denied
    assert ring.call(lambda: ring.client.metrics.ring_dropped.get("bad_registration", 0)) == 0
    # Nothing reached the decode worker either (its own drop counters, in its load reports).
    time.sleep(1.5)
    assert _decode_drops(ring) == drops


def test_a_member_cannot_take_over_a_live_workers_name(ring, baseline):
    before = ring.registered()
    sink = ring.submit(SamplingParams(temperature=0, max_tokens=400))
    deadline = time.monotonic() + 30
    while not ring.call(lambda: len(sink.ids)):  # streaming from decode-0
        assert time.monotonic() < deadline
        time.sleep(0.01)
    impostor = ring.socket(zmq.DEALER, ring.fe.ring_addr, b"decode-0/bad", ring.member_keys)
    impostor.send_multipart(_ready_from(ring, "decode-0", 0xBAD))
    gone = Health("decode-0", 0xBAD, "exiting", 4242, {})
    impostor.send_multipart([bytes(f) for f in codec.encode(gone)])

    async def wait():
        return await sink.done

    assert ring.run(wait(), 60) == ("finished", "length")  # the stream was not aborted
    assert len(sink.ids) == 400
    assert ring.registered() == before
    dropped = ring.call(lambda: dict(ring.client.metrics.ring_dropped))
    assert dropped.get("identity_in_use", 0) >= 1
    # It was never sent a prompt.
    assert ring.generate() == baseline
    _nothing_but_announces(impostor)


def test_the_handoff_port_takes_only_handoffs(ring, baseline):
    before = ring.registered()
    push = ring.socket(zmq.PUSH, ring.handoff, keys=ring.member_keys)
    announce = Health("frontend", 1, "announce", 1, {})
    for frames in (
        [b"abc"],
        [msgpack.packb({"t": "shutdown", "v": 1, "drain": False, "timeout": 0.0})],
        [bytes(f) for f in codec.encode(announce)],
    ):
        push.send_multipart(frames)

    deadline = time.monotonic() + 30
    while _decode_drops(ring).get("unexpected", 0) < 2:
        assert time.monotonic() < deadline, _decode_drops(ring)
        time.sleep(0.1)
    assert _decode_drops(ring).get("malformed", 0) >= 1
    assert ring.registered() == before  # the decode worker neither exited nor re-registered
    assert ring.generate() == baseline


ROUTES = [b"decode-0/1", b"prefill-0/2", b"prefill-5/3", b"\x00\xffjunk"]


@pytest.fixture(scope="module")
def fuzz_peers(ring):
    dealers = [ring.socket(zmq.DEALER, ring.fe.ring_addr, r, ring.member_keys) for r in ROUTES]
    push = ring.socket(zmq.PUSH, ring.handoff, keys=ring.member_keys)
    return dealers, push


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(target=st.integers(0, len(ROUTES)), message=any_frames)
def test_random_frames_on_every_socket_crash_nothing(ring, fuzz_peers, target, message):
    if not message:
        return
    dealers, push = fuzz_peers
    sock = push if target == len(ROUTES) else dealers[target]
    sock.send_multipart(message)


def test_after_the_random_frames_the_ring_serves_as_before(ring, baseline, fuzz_peers):
    # Runs after the property test above (same module, file order): everything it sent has
    # been read, nothing registered, nobody restarted, and the same request gives the same
    # tokens.
    time.sleep(1.0)
    assert ring.generate() == baseline
    assert set(ring.registered()) == {"prefill-0", "decode-0"}
    assert ring.supervisor.restarts == 0
    dropped = ring.call(lambda: sum(ring.client.metrics.ring_dropped.values()))
    assert dropped > 50
    stats = ring.call(lambda: ring.client.workers["decode-0"].stats)
    assert sum(stats.dropped.values()) > 10
    # No Submit ever reached a fuzzing peer.
    dealers, _ = fuzz_peers
    for d in dealers:
        while d.poll(0):
            assert not isinstance(codec.decode_strict(d.recv_multipart()), Submit)
