"""The frontend's heartbeat judgement with a real EngineClient and a worker played by a test
socket: a worker that keeps sending is never declared dead because the frontend's own loop was
busy when its heartbeats arrived (they are read before the judgement); a silent one is."""

from __future__ import annotations

import threading
import time

import pytest
import zmq
from deepring.config import FrontendConfig
from deepring.frontend.client import EngineClient
from deepring.ipc import codec
from deepring.ipc.messages import Health
from deepring.ipc.validate import worker_route
from loop_thread import LoopThread

INTERVAL, TIMEOUT = 0.05, 0.6
INFO = {
    "role": "prefill", "model": "tiny", "model_type": "deepseek_v4", "random_weights": True,
    "zero_cost": True, "max_model_len": 512, "vocab_size": 1000, "eos_token_ids": [1],
    "num_slots": 4, "num_blocks": 64, "block_size": 128, "tokenizer": None, "handoff_addr": None,
}  # fmt: skip


class Frontend(LoopThread):
    """An EngineClient on its own event loop thread."""

    def __init__(self, addr: str) -> None:
        super().__init__()
        self.config = FrontendConfig(
            ring_addr=addr, heartbeat_interval=INTERVAL, heartbeat_timeout=TIMEOUT
        )
        self.client = EngineClient(self.config)
        self.call(lambda: self.client.start(self.loop))

    def registered(self) -> set[str]:
        return self.call(lambda: set(self.client.workers))

    def block(self, seconds: float) -> None:
        """Keep the frontend's loop busy (a long callback: what a starved process looks like)."""
        self.loop.call_soon_threadsafe(time.sleep, seconds)

    def close(self) -> None:
        self.call(self.client.close)
        self.stop()


class FakeWorker:
    """A worker's DEALER socket that says `ready`, then `alive` every INTERVAL while beating."""

    def __init__(self, addr: str, wid: str = "prefill-0", gen: int = 7) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.identity = worker_route(wid, gen)
        self.sock.connect(addr)
        self.wid, self.gen = wid, gen
        self.beating = threading.Event()
        self.stop = threading.Event()
        self._send("ready", INFO)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _send(self, state: str, info: dict | None = None) -> None:
        msg = Health(self.wid, self.gen, state, 4242, info or {})
        self.sock.send_multipart([bytes(f) for f in codec.encode(msg)])

    def _run(self) -> None:
        # The socket is used from this thread only once it starts (zmq sockets are not
        # thread-safe); the frontend's messages to it are drained and ignored.
        while not self.stop.wait(INTERVAL):
            while self.sock.poll(0):
                self.sock.recv_multipart()
            if self.beating.is_set():
                self._send("alive")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close(0)
        self.ctx.term()


def _wait(cond, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def ring(tmp_path):
    addr = f"ipc://{tmp_path}/ring"
    fe = Frontend(addr)
    worker = FakeWorker(addr)
    worker.beating.set()
    yield fe, worker
    worker.close()
    fe.close()


def test_heartbeats_that_arrived_while_the_loop_was_busy_keep_the_worker(ring):
    fe, _ = ring
    assert _wait(lambda: fe.registered() == {"prefill-0"}), "the worker never registered"
    # Twice the timeout without the loop reading: the heartbeats sent meanwhile wait unread.
    fe.block(2 * TIMEOUT)
    time.sleep(2 * TIMEOUT + 5 * INTERVAL)
    # (Declared dead, it would stay unregistered: this worker never says `ready` again.)
    assert fe.registered() == {"prefill-0"}


def test_a_silent_worker_is_declared_dead(ring):
    fe, worker = ring
    assert _wait(lambda: fe.registered() == {"prefill-0"}), "the worker never registered"
    worker.beating.clear()
    assert _wait(lambda: fe.registered() == set(), 5 * TIMEOUT), "a silent worker stayed"
