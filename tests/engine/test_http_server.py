"""The frontend's HTTP/1.1 server against real sockets: keep-alive, pipelining, chunked
bodies both ways, size limits, malformed input, disconnects, handler failures."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading

import pytest
from deepring.frontend.http import HttpLimits, HttpRequest, HttpServer
from deepring.protocol.errors import error_body

LIMIT = 4096


class App:
    def __init__(self) -> None:
        self.disconnects: list[str] = []
        self.gone = threading.Event()

    async def handle(self, req: HttpRequest) -> None:
        loop = asyncio.get_running_loop()
        if req.path == "/echo":
            body = {
                "method": req.method,
                "query": req.query,
                "body": req.body.decode(),
                "headers": req.headers,
            }
            req.respond(200, json.dumps(body).encode())
        elif req.path == "/stream":
            req.start_stream(first=b"one,")
            loop.call_later(0.01, req.write, b"two,")
            loop.call_later(0.02, req.end_stream, b"three")
        elif req.path == "/forever":

            def gone() -> None:
                self.disconnects.append(req.path)
                self.gone.set()

            req.on_disconnect = gone
            req.start_stream(first=b"data: hello\n\n")
        elif req.path == "/slow":
            await asyncio.sleep(0.05)
            req.respond(200, b"slow", content_type="text/plain")
        elif req.path == "/boom":
            raise RuntimeError("handler bug")
        else:
            req.respond(404, error_body(req.path, 404, "no route"))


def _serve(keepalive: float):
    app = App()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict = {"app": app}

    def run() -> None:
        asyncio.set_event_loop(loop)
        limits = HttpLimits(max_body_bytes=LIMIT, keepalive_timeout=keepalive)
        srv = HttpServer(app.handle, error_body, limits)
        state["port"] = loop.run_until_complete(srv.start("127.0.0.1", 0))
        ready.set()
        loop.run_forever()
        srv.stop_listening()
        srv.close_all()
        loop.run_until_complete(asyncio.sleep(0.05))
        loop.run_until_complete(srv.wait_closed())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    return state, loop, thread


@pytest.fixture
def server():
    state, loop, thread = _serve(keepalive=30.0)
    yield state
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _conn(server) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", server["port"], timeout=10)


def _raw(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server["port"]), timeout=10)


def _read_until_closed(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_keep_alive_serves_several_requests_on_one_connection(server):
    c = _conn(server)
    try:
        c.request("GET", "/echo?x=1")
        r = c.getresponse()
        first = json.loads(r.read())
        sock = c.sock
        c.request("POST", "/echo", body=b"hello", headers={"X-Test": "a"})
        second = json.loads(c.getresponse().read())
        assert c.sock is sock  # same connection
    finally:
        c.close()
    assert first == {"method": "GET", "query": "x=1", "body": "", "headers": first["headers"]}
    assert second["body"] == "hello"
    assert second["headers"]["x-test"] == "a"
    assert r.getheader("content-type") == "application/json"


def test_streaming_response_is_chunked(server):
    c = _conn(server)
    try:
        c.request("GET", "/stream")
        r = c.getresponse()
        assert r.getheader("transfer-encoding") == "chunked"
        assert r.getheader("content-type") == "text/event-stream"
        assert r.read() == b"one,two,three"
        c.request("GET", "/echo")  # the connection is reusable after a stream
        assert c.getresponse().status == 200
    finally:
        c.close()


def test_chunked_request_body(server):
    c = _conn(server)
    try:
        c.request("POST", "/echo", body=iter([b"ab", b"cd", b"ef"]), encode_chunked=True)
        assert json.loads(c.getresponse().read())["body"] == "abcdef"
    finally:
        c.close()


def test_body_over_the_limit_gets_413_before_it_is_read(server):
    with _raw(server) as s:
        s.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {LIMIT + 1}"
            "\r\n\r\n".encode()
        )
        reply = _read_until_closed(s)  # answered and closed without waiting for the body
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in head
    err = json.loads(body)["error"]
    assert "too large" in err["message"]
    assert err["code"] == "request_too_large"


def test_chunked_body_over_the_limit_gets_413(server):
    with _raw(server) as s:
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"x" * 1000
        for _ in range(5):
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        reply = _read_until_closed(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "request_too_large", "message": json.loads(body)["error"]["message"]},
    }


@pytest.mark.parametrize(
    "request_bytes", [b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nbad header\r\n\r\n"]
)
def test_malformed_requests_get_400_and_close(server, request_bytes):
    with _raw(server) as s:
        s.sendall(request_bytes)
        reply = _read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert b"malformed HTTP request" in reply


def test_pipelined_requests_are_answered_in_order(server):
    with _raw(server) as s:
        s.sendall(
            b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /echo?n=2 HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /echo?n=3 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        reply = _read_until_closed(s)
    assert reply.count(b"HTTP/1.1 200 OK") == 3
    assert reply.index(b"slow") < reply.index(b'"n=2"') < reply.index(b'"n=3"')


def test_expect_100_continue(server):
    with _raw(server) as s:
        s.sendall(
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nexpect: 100-continue\r\n"
            b"connection: close\r\n\r\n"
        )
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"abc")
        reply = _read_until_closed(s)
    assert b'"body": "abc"' in reply


def test_client_disconnect_mid_stream_calls_back(server):
    app = server["app"]
    s = _raw(server)
    s.sendall(b"GET /forever HTTP/1.1\r\nhost: x\r\n\r\n")
    assert b"data: hello" in s.recv(4096)
    s.close()
    assert app.gone.wait(5)
    assert app.disconnects == ["/forever"]


def test_handler_failure_is_a_500(server):
    c = _conn(server)
    try:
        c.request("GET", "/boom")
        r = c.getresponse()
        assert r.status == 500
        assert json.loads(r.read())["error"]["type"] == "server_error"
        c.request("GET", "/nope")
        r = c.getresponse()
        assert r.status == 404
        r.read()
    finally:
        c.close()


def test_connection_close_is_honoured(server):
    with _raw(server) as s:
        s.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        reply = _read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert b"connection: close" in reply


def test_idle_keep_alive_connections_are_closed():
    state, loop, thread = _serve(keepalive=0.2)
    try:
        with _raw(state) as s:
            s.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
            # Returns when the server closes the idle connection (the socket times out if not).
            reply = _read_until_closed(s)
        assert reply.startswith(b"HTTP/1.1 200 OK")
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
