"""A real HttpServer on a real socket, run on its own event loop thread, for the HTTP tests:
a small route table for the server's own behaviour, and the frontend's App over a stand-in
for the engine (it answers every request at once with a few fixed tokens)."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import threading
import time

import numpy as np
from deepring.config import FrontendConfig
from deepring.frontend.app import App
from deepring.frontend.http import HttpLimits, HttpRequest, HttpServer
from deepring.frontend.metrics import Metrics
from deepring.protocol.errors import error_body


class Routes:
    """Routes that exercise the server: echo, streams, a slow answer, a stream that floods."""

    def __init__(self) -> None:
        self.disconnects: list[str] = []
        self.gone = threading.Event()
        self.peak = 0  # the largest send buffer /flood saw

    async def handle(self, req: HttpRequest) -> None:
        loop = asyncio.get_running_loop()
        if req.path == "/echo":
            req.respond(200, b'{"method": "%s", "body": %d}' % (req.method.encode(), len(req.body)))
        elif req.path == "/fixed":
            req.respond(200, b"0123456789", content_type="text/plain")
        elif req.path == "/bulk":  # 4 MiB in one write: more than the socket buffers hold
            req.respond(200, b"x" * (4 << 20), content_type="text/plain")
        elif req.path == "/stream":
            req.start_stream(first=b"data: one\n\n")
            loop.call_later(0.05, req.write, b"data: two\n\n")
            loop.call_later(0.1, req.end_stream, b"data: three\n\n")
        elif req.path == "/slow":
            await asyncio.sleep(0.3)
            req.respond(200, b"slow", content_type="text/plain")
        elif req.path == "/forever":
            req.on_disconnect = lambda: self._gone(req.path)
            req.start_stream(first=b"data: hello\n\n")
        elif req.path == "/flood":
            req.on_disconnect = lambda: self._gone(req.path)
            req.start_stream(first=b"data: start\n\n")
            chunk = b"data: " + b"x" * (64 << 10) + b"\n\n"

            def more() -> None:
                if not req.disconnected:
                    req.write(chunk)
                    self.peak = max(self.peak, req._conn.transport.get_write_buffer_size())
                    loop.call_later(0.01, more)

            more()
        else:
            req.respond(404, error_body(req.path, 404, "no route"))

    def _gone(self, path: str) -> None:
        self.disconnects.append(path)
        self.gone.set()


class ServerThread:
    """An HttpServer for `handler` on 127.0.0.1 (any port), on a loop in a daemon thread."""

    def __init__(self, handler, limits: HttpLimits, use_uvloop: bool = False) -> None:
        if use_uvloop:
            import uvloop

            self.loop = uvloop.new_event_loop()
        else:
            self.loop = asyncio.new_event_loop()
        self.server = HttpServer(handler, error_body, limits)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.port = self.loop.run_until_complete(self.server.start("127.0.0.1", 0))
            ready.set()
            self.loop.run_forever()
            self.server.stop_listening()
            for conn in [*self.server.connections, *self.server.turned_away]:
                if conn.transport is not None:
                    conn.transport.abort()
            self.loop.run_until_complete(asyncio.sleep(0.05))
            self.loop.run_until_complete(self.server.wait_closed())
            self.loop.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def call(self, fn):
        """fn() on the server's loop; its result."""
        done = threading.Event()
        out: list = []

        def go() -> None:
            out.append(fn())
            done.set()

        self.loop.call_soon_threadsafe(go)
        assert done.wait(10)
        return out[0]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (the socket's timeout bounds each wait)."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def exchange(srv: ServerThread, data: bytes, half_close: bool = False) -> bytes:
    """Send data on a fresh connection (then shut our side when asked); what comes back."""
    with srv.connect() as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return read_all(s)


def request(srv: ServerThread, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request with `connection: close` semantics: status, headers, body."""
    reply = exchange(srv, data)
    return parse_response(reply)


def parse_response(reply: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, body


def timed(fn) -> tuple[float, object]:
    t = time.monotonic()
    out = fn()
    return time.monotonic() - t, out


class StubEngine:
    """The EngineClient surface the App uses, answering each request at once with `reply`
    token ids and "stop"; records what was submitted."""

    def __init__(self, tokenizer: str, max_model_len: int, reply: list[int]) -> None:
        self._info = {
            "tokenizer": str(tokenizer),
            "model_type": "deepseek_v4",
            "max_model_len": max_model_len,
            "eos_token_ids": [],
            "model": "stub",
            "zero_cost": True,
        }
        self.reply = reply
        self.ready = True
        self.workers: dict = {}
        self.requests: dict = {}
        self.queued = 0
        self.submitted: list[np.ndarray] = []

    def info(self, key: str):
        return self._info.get(key)

    def submit(self, prompt_ids, params, seed, sink, cache_class="chat", constraint=None,
               images=()) -> int:  # fmt: skip
        self.submitted.append(np.asarray(prompt_ids))
        loop = asyncio.get_running_loop()

        def answer() -> None:
            sink.start(0)
            sink.tokens(list(self.reply), "stop")

        loop.call_soon(answer)
        return len(self.submitted)

    def abort(self, rid: int) -> None:
        pass


def app_server(
    tokenizer: str,
    limits: HttpLimits,
    max_model_len: int = 4096,
    allowed_origins: tuple[str, ...] = (),
    use_uvloop: bool = False,
) -> tuple[ServerThread, App, StubEngine]:
    """The frontend's App (routes, checks, prompt preparation) over a StubEngine."""
    from deepring.protocol.tokenizer import load_tokenizer

    reply = load_tokenizer(tokenizer).encode_plain("Hello there.")
    engine = StubEngine(tokenizer, max_model_len, reply)
    config = FrontendConfig(
        ring_addr="ipc:///tmp/deepring-http-test-ring",
        max_body_bytes=limits.max_body_bytes,
        allowed_origins=allowed_origins,
    )
    app = App(config, engine, Metrics())  # type: ignore[arg-type]
    app.load_recipe()
    assert app.recipe is not None, app.recipe_error
    return ServerThread(app.handle, limits, use_uvloop), app, engine


def send_all_at_once(port: int, data: bytes, n: int) -> list[int]:
    """Send `data` on n connections at once from this one thread (non-blocking sockets, so a
    test's load is one thread, not n); the status of each answer."""
    sel = selectors.DefaultSelector()
    pending: dict[socket.socket, list] = {}
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setblocking(False)
        pending[s] = [memoryview(data), b""]
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    statuses = []
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        for key, events in sel.select(1):
            s, st = key.fileobj, pending[key.fileobj]
            if events & selectors.EVENT_WRITE and st[0]:
                with contextlib.suppress(BlockingIOError):
                    st[0] = st[0][s.send(st[0][: 1 << 20]) :]
                if not st[0]:
                    sel.modify(s, selectors.EVENT_READ)
            if events & selectors.EVENT_READ:
                try:
                    chunk = s.recv(65536)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    chunk = b""
                st[1] += chunk
                if not chunk:
                    statuses.append(int(st[1][9:12] or 0))
                    sel.unregister(s)
                    s.close()
                    del pending[s]
    for s in pending:
        s.close()
    sel.close()
    return statuses
