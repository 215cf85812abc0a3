"""The rings end to end without HTTP: real prefill and decode processes (spawned, supervised)
and the frontend's EngineClient, driven with token ids.

Serving must produce what offline generation produces; an abort frees the request's blocks;
a killed decode worker fails its requests with a clear error and is restarted; junk on the
ring is dropped without crashing anyone; a full queue refuses requests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import msgpack
import pytest
from deepring import LLM, SamplingParams
from deepring.config import EngineSpec, FrontendConfig, WorkerConfig
from deepring.frontend.client import EngineClient
from deepring.frontend.requests import Overloaded
from deepring.launcher import Supervisor
from loop_thread import LoopThread

pytestmark = pytest.mark.slow

SPEC = EngineSpec(model="tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=96)


class Collect:
    """A Sink that records what the frontend would stream."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ids: list[int] = []
        self.cache_hit: int | None = None
        self.done: asyncio.Future = loop.create_future()

    def start(self, cache_hit: int) -> None:
        self.cache_hit = cache_hit

    def tokens(self, ids: list[int], finish: str | None, logprobs=None) -> bool:
        self.ids += ids
        if finish is not None:
            self.done.set_result(("finished", finish))
        return False

    def error(self, message: str, status: int = 500) -> None:
        self.done.set_result(("error", message))


class Ring(LoopThread):
    def __init__(self, root, spec: EngineSpec = SPEC, max_queued: int = 8) -> None:
        super().__init__()
        self.fe = FrontendConfig(
            ring_addr=f"ipc://{root}/ring",
            max_queued_requests=max_queued,
            heartbeat_interval=0.5,
            heartbeat_timeout=20.0,
        )
        common = {
            "frontend_addrs": (self.fe.ring_addr,),
            "parent_pid": os.getpid(),
            "heartbeat_interval": 0.5,
            "heartbeat_timeout": 20.0,
        }
        self.workers = (
            WorkerConfig(role="prefill", index=0, engine=spec, **common),
            WorkerConfig(
                role="decode",
                index=0,
                engine=spec,
                handoff_bind=f"ipc://{root}/handoff-0",
                **common,
            ),
        )
        self.fatal: list[str] = []
        self.call(self._start)
        self.run(self.client.wait_ready(), timeout=120)

    def _start(self) -> None:
        self.client = EngineClient(self.fe)
        self.client.start(self.loop)
        self.supervisor = Supervisor(self.workers, self.client, self.fatal.append)
        self.supervisor.start()

    def submit(self, prompt: list[int], params: SamplingParams, seed: int = 0):
        def go():
            sink = Collect(self.loop)
            rid = self.client.submit(prompt, params, seed, sink)
            return rid, sink

        return self.call(go)

    def wait(self, sink: Collect, timeout: float = 120):
        async def get():
            return await sink.done

        return self.run(get(), timeout)

    def generate(self, prompt: list[int], params: SamplingParams, seed: int = 0):
        _, sink = self.submit(prompt, params, seed)
        return self.wait(sink), sink.ids

    def stats(self, wid: str):
        return self.call(lambda: self.client.workers[wid].stats)

    def wait_for(self, predicate, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.call(predicate):
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached")
            time.sleep(0.05)

    def close(self) -> None:
        self.run(self.supervisor.stop(timeout=10))
        self.call(self.client.close)
        self.stop()


@pytest.fixture(scope="module")
def ring(tmp_path_factory, deepring_cache_dir):
    r = Ring(tmp_path_factory.mktemp("ring"))
    yield r
    r.close()
    assert not r.fatal


@pytest.fixture(scope="module")
def llm(deepring_cache_dir):
    return LLM("tiny", max_num_seqs=4, max_model_len=512, max_num_batched_tokens=96)


def _prompt(n: int, salt: int) -> list[int]:
    return [(13 * j + 997 * salt) % 120000 + 3 for j in range(n)]


def test_serving_matches_offline_generation(ring, llm):
    prompts = [_prompt(n, i) for i, n in enumerate((7, 150, 64, 3))]
    params = [
        SamplingParams(temperature=0, max_tokens=10),
        SamplingParams(temperature=0.7, top_p=0.9, seed=21, max_tokens=8),
        SamplingParams(temperature=0, max_tokens=1),
        SamplingParams(temperature=1.2, top_k=50, seed=8, max_tokens=12),
    ]
    want = [o.token_ids for o in llm.generate(prompts, params)]
    sinks = [ring.submit(p, sp, sp.seed or 0)[1] for p, sp in zip(prompts, params, strict=True)]
    for sink, w in zip(sinks, want, strict=True):
        assert ring.wait(sink) == ("finished", "length")
        assert sink.ids == w
        assert sink.cache_hit == 0


def test_abort_frees_the_blocks(ring):
    rid, sink = ring.submit(_prompt(200, 5), SamplingParams(temperature=0, max_tokens=300))
    ring.wait_for(lambda: len(sink.ids) >= 3)
    ring.call(ring.client.abort, rid)
    ring.wait_for(
        lambda: (
            (s := ring.client.workers["decode-0"].stats) is not None
            and s.used_blocks == 0
            and s.running == 0
        )
    )
    assert not sink.done.done()  # an aborted request gets nothing more
    assert ring.generate(_prompt(5, 6), SamplingParams(temperature=0, max_tokens=3))[0] == (
        "finished",
        "length",
    )


def test_junk_on_the_ring_is_dropped(ring):
    pid = ring.call(lambda: ring.client.workers["decode-0"].pid)
    junk = [
        [b"\xc1\xc1"],
        [msgpack.packb({"t": "teleport", "v": 1})],
        [msgpack.packb({"t": "abort", "v": 99, "rids": [1], "reason": "x"})],
        [msgpack.packb({"t": "abort", "v": 1, "rids": "not a list", "reason": "x"})],
    ]
    routes = ring.call(lambda: [ring.client.workers[w].route for w in ("decode-0", "prefill-0")])
    for frames in junk:
        for route in routes:
            ring.call(ring.client.sock.send_multipart, [route, *frames])
    status, ids = ring.generate(_prompt(9, 7), SamplingParams(temperature=0, max_tokens=4))
    assert status == ("finished", "length")
    assert len(ids) == 4
    assert ring.call(lambda: ring.client.workers["decode-0"].pid) == pid


def test_killed_decode_worker_is_invisible_to_its_request(ring):
    """The only decode worker dies mid-stream: the request is rerouted with its tokens so far,
    waits for the restarted worker, and ends with the tokens of an uninterrupted run."""
    params = SamplingParams(temperature=0, max_tokens=60)
    want = ring.generate(_prompt(20, 8), params)
    old = ring.call(lambda: ring.client.workers["decode-0"].pid)
    _rid, sink = ring.submit(_prompt(20, 8), params)
    ring.wait_for(lambda: len(sink.ids) >= 2)
    os.kill(old, signal.SIGKILL)
    assert (ring.wait(sink), sink.ids) == want
    new = ring.call(lambda: ring.client.workers["decode-0"].pid)
    assert new != old
    assert ring.supervisor.restarts == 1
    assert ring.call(lambda: ring.client.metrics.rerouted) == 1


def test_a_full_queue_refuses_requests(ring):
    # Capacity: 4 decode slots + 8 queued.
    sinks = [
        ring.submit(_prompt(10, 30 + i), SamplingParams(temperature=0, max_tokens=200))[1]
        for i in range(12)
    ]
    with pytest.raises(Overloaded, match="at capacity"):
        ring.submit(_prompt(10, 50), SamplingParams(max_tokens=2))
    rids = ring.call(lambda: list(ring.client.requests))
    for rid in rids:
        ring.call(ring.client.abort, rid)
    assert not any(s.done.done() for s in sinks)
    status, _ = ring.generate(_prompt(4, 51), SamplingParams(temperature=0, max_tokens=2))
    assert status == ("finished", "length")


@pytest.mark.parametrize("last", ["length", "stop"])
def test_a_request_whose_last_token_arrived_is_finished_not_rerouted(ring, last):
    """Its worker died (or left) between the last token and the finish: the request is
    complete, so it finishes (as the worker would have: max_tokens, or a stop token) instead of
    being resubmitted, which a worker would refuse."""
    params = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=(7,))
    received = [11, 12, 13, 14, 15, 16] if last == "length" else [11, 12, 7]

    def go():
        sink = Collect(ring.loop)
        rid = ring.client.submit(_prompt(12, 9), params, 0, sink)
        st = ring.client.requests[rid]
        st.add(0, received)  # as if these had come from its workers
        before = ring.client.metrics.rerouted
        ring.client._reroute(st, "test: its worker is gone")
        return sink, before

    sink, before = ring.call(go)
    assert ring.wait(sink) == ("finished", last)
    assert sink.ids == received
    assert ring.call(lambda: ring.client.metrics.rerouted) == before
