"""Hostile clients against the frontend's HTTP server, on real sockets, each bounded in time
(small timeouts through HttpLimits): slowloris heads and bodies, connection floods and accept()
failures, oversized request lines and headers, HEAD, half-closed clients, request smuggling,
cross-site requests, pipelining and readers that do not read, a prompt that fills the context,
and prompts too long to tokenize."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from deepring.frontend.http import MAX_WRITE_BUFFER, HttpLimits
from http_helpers import (
    Routes,
    ServerThread,
    app_server,
    exchange,
    parse_response,
    read_all,
    request,
    send_all_at_once,
    timed,
)

LIMITS = HttpLimits(
    max_body_bytes=1 << 20,
    header_timeout=0.5,
    body_timeout=0.5,
    keepalive_timeout=1.0,
    write_timeout=0.5,
    max_connections=64,
)


@pytest.fixture
def routes():
    return Routes()


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_kind(request):
    """Both event loops: the tests run the server on asyncio's, `deepring serve` on uvloop."""
    return request.param


@pytest.fixture
def srv(routes, loop_kind):
    s = _serve(routes, loop_kind)
    yield s
    s.stop()


def _serve(routes, loop_kind: str, **limits) -> ServerThread:
    fields = {**LIMITS.__dict__, **limits}
    return ServerThread(routes.handle, HttpLimits(**fields), use_uvloop=loop_kind == "uvloop")


# ---- 1. timeouts -----------------------------------------------------------------------------


def test_a_partial_head_gets_408_within_the_header_timeout(srv):
    took, reply = timed(lambda: exchange(srv, b"GET /echo HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n"))
    status, headers, _ = parse_response(reply)
    assert status == 408
    assert headers["connection"] == "close"
    assert 0.4 < took < 3
    assert srv.call(lambda: dict(srv.server.refused)) == {"header_timeout": 1}


def test_a_trickled_head_is_not_kept_alive_by_each_byte(srv):
    with srv.connect(timeout=0.1) as s:
        s.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\nx-slow: ")
        start, reply = time.monotonic(), b""
        while time.monotonic() - start < 5 and not reply:
            try:
                s.sendall(b"a")
                reply = s.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        took = time.monotonic() - start
    assert reply.startswith(b"HTTP/1.1 408 ")
    assert took < 2.5


def test_a_connection_that_sends_nothing_is_closed(srv):
    with srv.connect() as s:
        took, reply = timed(lambda: read_all(s))
    assert reply == b""
    assert took < 3


def test_a_stalled_body_gets_408(srv):
    data = b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n" + b"x" * 10
    took, reply = timed(lambda: exchange(srv, data))
    assert reply.startswith(b"HTTP/1.1 408 ")
    assert b"stopped arriving" in reply
    assert 0.4 < took < 3
    assert srv.call(lambda: dict(srv.server.refused)) == {"body_timeout": 1}


def test_idle_keep_alive_connections_are_closed(srv):
    with srv.connect() as s:
        s.sendall(b"GET /fixed HTTP/1.1\r\nhost: x\r\n\r\n")
        took, reply = timed(lambda: read_all(s))
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert 0.8 < took < 4


def test_a_slowloris_flood_is_shed_and_others_are_served(routes, loop_kind):
    srv = _serve(routes, loop_kind, max_connections=1024)
    held = []
    try:
        for _ in range(300):
            s = srv.connect()
            s.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\n")
            held.append(s)
        took, (status, _, _) = timed(lambda: request(srv, b"GET /fixed HTTP/1.0\r\n\r\n"))
        assert status == 200
        assert took < 0.5
        deadline = time.monotonic() + 10
        while srv.call(lambda: len(srv.server.connections)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.call(lambda: len(srv.server.connections)) == 0
        assert all(read_all(s).startswith(b"HTTP/1.1 408 ") for s in held)
    finally:
        for s in held:
            s.close()
        srv.stop()


# ---- 2. connection cap and accept() failures -------------------------------------------------


def test_connections_over_the_cap_get_503_and_close(routes, loop_kind):
    srv = _serve(routes, loop_kind, max_connections=4, keepalive_timeout=30.0, header_timeout=30.0)
    held = []
    try:
        for _ in range(4):
            s = srv.connect()
            s.sendall(b"GET /fixed HTTP/1.1\r\nhost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
            held.append(s)
        took, (status, headers, body) = timed(
            lambda: request(srv, b"GET /fixed HTTP/1.1\r\nhost: x\r\n\r\n")
        )
        assert status == 503
        assert headers["retry-after"] == "1"
        assert headers["connection"] == "close"
        assert "too many open connections" in json.loads(body)["error"]["message"]
        assert took < 1  # answered at once, not after the linger
        assert srv.call(lambda: dict(srv.server.refused)) == {"connection_limit": 1}
        held.pop().close()
        deadline = time.monotonic() + 5
        while srv.call(lambda: len(srv.server.connections)) > 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert request(srv, b"GET /fixed HTTP/1.0\r\n\r\n")[0] == 200
    finally:
        for s in held:
            s.close()
        srv.stop()


_EMFILE_SERVER = """
import asyncio, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
sys.path.insert(0, sys.argv[2])
from http_helpers import Routes
from deepring.frontend.http import HttpLimits, HttpServer
from deepring.protocol.errors import error_body

async def main():
    srv = HttpServer(Routes().handle, error_body, HttpLimits(max_connections=1000))
    print(await srv.start("127.0.0.1", 0), flush=True)
    await asyncio.sleep(3600)

if sys.argv[1] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_accept_failures_neither_kill_nor_spin_the_server(loop, tmp_path):
    """A --max-connections above the open-file limit: accept() fails with EMFILE while the
    flood lasts; the server uses little CPU and logs little meanwhile, and serves again once
    it is over."""
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _EMFILE_SERVER, loop, str(Path(__file__).parent)],
            stdout=subprocess.PIPE,
            stderr=err,
        )
    flood: list[socket.socket] = []
    try:
        port = int(proc.stdout.readline())
        for _ in range(120):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.3)
        before = _cpu_seconds(proc.pid)
        time.sleep(1.0)
        assert _cpu_seconds(proc.pid) - before < 0.3  # not spinning on accept()
        for s in flood:
            s.close()
        flood.clear()
        deadline, status = time.monotonic() + 15, None
        while status != 200 and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(b"GET /fixed HTTP/1.0\r\n\r\n")
                    status = parse_response(read_all(s))[0]
            except (OSError, IndexError, ValueError):
                time.sleep(0.2)
        assert status == 200
        assert proc.poll() is None
    finally:
        for s in flood:
            s.close()
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
    # One warning line at most (asyncio's own accepting would log a traceback per retry).
    assert stderr.read_text().count("accept()") <= 1


# ---- 3. oversized request lines and heads ----------------------------------------------------


def _h(line: str, *fields: str, body: bytes = b"", end: bool = True) -> bytes:
    """A request: its line, its header fields (each "name: value"), the empty line, body."""
    head = "".join(f"{x}\r\n" for x in (line, *fields)).encode()
    return head + (b"\r\n" + body if end else b"")


_BIG = "a" * 9000


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (_h("GET /" + "a" * (9 << 10) + " HTTP/1.1", "host: x"), 414),
        (_h("GET /" + "a" * (70 << 10) + " HTTP/1.1", "host: x"), 414),
        (_h("GET / HTTP/1.1", "host: x", "x-big: " + "a" * (20 << 10)), 431),
        (_h("GET / HTTP/1.1", "host: x", f"x-a: {_BIG}", end=False), 408),
        (_h("GET / HTTP/1.1", "host: x", *(f"x-{i}: {_BIG}" for i in range(8))), 431),
        (_h("GET / HTTP/1.1", "host: x", *(f"x-{i}: 1" for i in range(101))), 431),
        (_h("CONNECT example.com:443 HTTP/1.1", "host: example.com:443"), 405),
        (_h("GET / HTTP/2.0", "host: x"), 505),
        (b"GET / HTTP/1.1\nhost: x\n\n", 400),
        (_h("GET / HTTP/1.1", "host: x", " folded: yes"), 400),
        (_h("GET / HTTP/1.1", "host : x"), 400),
        (_h("GET / HTTP/1.1"), 400),
        (_h("GET / HTTP/1.1", "host: a", "host: b"), 400),
        (_h("GET /a b HTTP/1.1", "host: x"), 400),
    ],
    ids=[
        "url-9k", "url-70k", "header-20k", "incomplete", "head-72k", "101-headers", "connect",
        "http2", "bare-lf", "folded", "space-before-colon", "no-host", "two-hosts", "space-in-url",
    ],
)  # fmt: skip
def test_bad_heads_are_answered_and_closed(srv, data, status, caplog):
    took, reply = timed(lambda: exchange(srv, data))
    assert reply.startswith(b"HTTP/1.1 %d " % status), reply[:200]
    assert b"connection: close" in reply
    assert "error" in json.loads(reply.partition(b"\r\n\r\n")[2])
    assert took < 3
    if status == 405:
        assert b"\r\nallow: GET, HEAD, POST, OPTIONS\r\n" in reply
    want = {431: "head_too_large", 414: "head_too_large", 408: "header_timeout"}.get(
        status, "malformed"
    )
    assert srv.call(lambda: dict(srv.server.refused)) == {want: 1}
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_a_huge_header_is_refused_early_and_cheaply(srv):
    """128 MiB of one header value: 431 after the first 64 KiB, the rest discarded as it comes
    (linear), and other clients are served meanwhile."""
    replies: list[bytes] = []

    def send_huge() -> None:
        with srv.connect() as s:
            s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-huge: ")
            block = b"a" * (1 << 20)
            try:
                for _ in range(128):
                    s.sendall(block)
            except (BrokenPipeError, ConnectionResetError):
                pass
            try:
                replies.append(s.recv(4096))
            except ConnectionResetError:
                replies.append(b"reset")

    t = threading.Thread(target=send_huge)
    t.start()
    worst = max(timed(lambda: request(srv, b"GET /fixed HTTP/1.0\r\n\r\n"))[0] for _ in range(20))
    t.join(30)
    assert not t.is_alive()
    assert worst < 0.5
    assert replies[0].startswith(b"HTTP/1.1 431 ")


# ---- 4. HEAD ---------------------------------------------------------------------------------


def test_head_gets_the_head_of_get_and_no_body(srv):
    with srv.connect() as s:
        s.sendall(
            b"HEAD /fixed HTTP/1.1\r\nhost: x\r\n\r\n"
            b"HEAD /stream HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /fixed HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        reply = read_all(s)
    head1, rest = reply.split(b"\r\n\r\n", 1)
    head2, rest = rest.split(b"\r\n\r\n", 1)
    assert head1.startswith(b"HTTP/1.1 200 ")
    assert b"content-length: 10" in head1
    assert head2.startswith(b"HTTP/1.1 200 ")
    assert b"transfer-encoding: chunked" in head2
    # The next response starts right after the heads: no body was sent for either.
    assert rest.startswith(b"HTTP/1.1 200 ")
    assert rest.endswith(b"\r\n\r\n0123456789")


# ---- 5. half-closed clients ------------------------------------------------------------------


def test_a_half_closed_client_gets_its_full_response(srv):
    reply = exchange(srv, b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n", half_close=True)
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert reply.endswith(b"\r\n\r\nslow")
    reply = exchange(srv, b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n", half_close=True)
    body = reply.partition(b"\r\n\r\n")[2]
    assert body.index(b"data: one") < body.index(b"data: two") < body.index(b"data: three")
    assert body.endswith(b"0\r\n\r\n")
    post = b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello"
    reply = exchange(srv, post + b"GET /fixed HTTP/1.1\r\nhost: x\r\n\r\n", half_close=True)
    assert reply.count(b"HTTP/1.1 200 ") == 2
    assert b'"body": 5' in reply
    assert reply.endswith(b"0123456789")


def test_a_client_that_closes_mid_stream_after_half_closing_is_detected(srv, routes):
    s = srv.connect()
    s.sendall(b"GET /forever HTTP/1.1\r\nhost: x\r\n\r\n")
    s.shutdown(socket.SHUT_WR)
    assert b"data: hello" in s.recv(4096)
    s.close()
    assert routes.gone.wait(5)
    assert routes.disconnects == ["/forever"]


# ---- 6. request smuggling --------------------------------------------------------------------

_SMUGGLED = _h("GET /fixed HTTP/1.1", "host: x")
_POST = ("POST /echo HTTP/1.1", "host: x")
_CHUNKED = (*_POST, "transfer-encoding: chunked")


@pytest.mark.parametrize(
    "data",
    [
        _h(*_CHUNKED, "content-length: 3", body=b"0\r\n\r\n" + _SMUGGLED),
        _h(*_POST, "content-length: 3", "content-length: 40", body=b"abc" + _SMUGGLED),
        _h(*_POST, "content-length: 3, 40", body=b"abc" + _SMUGGLED),
        _h(*_POST, "transfer-encoding: gzip, chunked", body=b"0\r\n\r\n" + _SMUGGLED),
        _h(*_CHUNKED, "transfer-encoding: identity", body=b"0\r\n\r\n"),
        _h(*_POST, "transfer-encoding: xchunked", body=b"0\r\n\r\n"),
        _h("POST /echo HTTP/1.0", "transfer-encoding: chunked", body=b"0\r\n\r\n"),
        _h(*_CHUNKED, body=b"zz\r\nabc\r\n0\r\n\r\n"),
        _h(*_CHUNKED, body=b"0x3\r\nabc\r\n0\r\n\r\n"),
        _h(*_CHUNKED, body=b"-3\r\nabc\r\n0\r\n\r\n"),
        _h(*_CHUNKED, body=b"3\r\nabcX\r\n0\r\n\r\n"),
        _h(*_CHUNKED, body=b"3\nabc\r\n0\r\n\r\n"),
        _h(*_CHUNKED, body=b"f" * 17 + b"\r\n"),
        _h(*_POST, "content-length: -1"),
        _h(*_POST, "content-length: +3", body=b"abc"),
        _h(*_POST, "content-length: 1 2", body=b"abc"),
    ],
    ids=[
        "cl-and-te", "two-cl", "cl-list", "te-gzip-chunked", "te-twice", "te-xchunked",
        "te-http10", "chunk-zz", "chunk-0x", "chunk-negative", "chunk-overrun", "chunk-bare-lf",
        "chunk-17-digits", "cl-negative", "cl-plus", "cl-space",
    ],
)  # fmt: skip
def test_ambiguous_framing_gets_400_and_close(srv, data):
    took, reply = timed(lambda: exchange(srv, data))
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    assert b"connection: close" in reply
    assert reply.count(b"HTTP/1.1 ") == 1  # nothing smuggled behind it was answered
    assert took < 3


def test_equal_repeated_content_lengths_are_one(srv):
    data = b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 3\r\n"
    status, _, body = request(srv, data + b"connection: close\r\n\r\nabc")
    assert status == 200
    assert json.loads(body)["body"] == 3


# ---- 8. pipelining and readers that do not read ----------------------------------------------


def test_many_pipelined_requests_are_answered_in_order(srv):
    reqs = b"".join(
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (i, b"x" * i)
        for i in range(50)
    )
    reply = exchange(srv, reqs + b"GET /fixed HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    bodies = [int(p.split(b"}")[0]) for p in reply.split(b'"body": ')[1:]]
    assert bodies == list(range(50))
    assert reply.endswith(b"0123456789")


def test_a_slow_reader_that_keeps_reading_gets_everything(srv):
    with srv.connect() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(b"GET /bulk HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        got = 0
        while chunk := s.recv(256 << 10):
            got += len(chunk)
            time.sleep(0.02)  # about 5 MB/s at most: longer than write_timeout in all
    assert got > 4 << 20


def test_a_reader_that_never_reads_is_dropped(srv, routes):
    with srv.connect() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(b"GET /flood HTTP/1.1\r\nhost: x\r\n\r\n")
        took, gone = timed(lambda: routes.gone.wait(20))
    assert gone
    assert routes.disconnects == ["/flood"]
    assert routes.peak <= MAX_WRITE_BUFFER + (64 << 10)
    assert took < 10
    assert srv.call(lambda: dict(srv.server.refused)) == {"slow_reader": 1}


# ---- 4, 7, 9, 10: the frontend's App ---------------------------------------------------------

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _post(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode() + b"connection: close\r\n\r\n" + body)
        return read_all(s)


JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def app_srv(v41_tokenizer_path):
    srv, app, engine = app_server(str(v41_tokenizer_path), LIMITS, max_model_len=64)
    yield srv, app, engine
    srv.stop()


def test_app_answers_head_like_get_without_a_body(app_srv):
    srv = app_srv[0]
    for path in (b"/health", b"/v1/models", b"/metrics"):
        get = exchange(srv, b"GET %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n" % path)
        head = exchange(srv, b"HEAD %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n" % path)
        g_status, g_headers, g_body = parse_response(get)
        h_status, h_headers, h_body = parse_response(head)
        assert (h_status, h_body) == (g_status, b"")
        assert h_headers["content-length"] == g_headers["content-length"] == str(len(g_body))
        assert h_headers["content-type"] == g_headers["content-type"]
    status, headers, _ = parse_response(
        exchange(srv, b"HEAD /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    )
    assert (status, headers["allow"]) == (405, "POST")
    status, headers, _ = parse_response(
        exchange(srv, b"DELETE /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    )
    assert (status, headers["allow"]) == (405, "GET, HEAD")


def test_generation_takes_json_only(app_srv):
    srv = app_srv[0]
    body = json.dumps(CHAT).encode()
    form = "application/x-www-form-urlencoded"
    for headers in ({"content-type": "text/plain"}, {}, {"content-type": form}):
        status, _, reply = parse_response(_post(srv.port, "/v1/chat/completions", body, headers))
        assert status == 415
        assert json.loads(reply)["error"]["code"] == "unsupported_media_type"
    status, _, reply = parse_response(
        _post(srv.port, "/v1/messages", body, {"content-type": "text/plain"})
    )
    assert status == 415
    assert json.loads(reply)["type"] == "error"  # Anthropic's shape on /v1/messages
    ctype = {"content-type": "Application/JSON; charset=utf-8"}
    status, _, reply = parse_response(_post(srv.port, "/v1/chat/completions", body, ctype))
    assert status == 200, reply
    assert json.loads(reply)["choices"][0]["message"]["content"] == "Hello there."


def test_cross_site_requests_are_refused_unless_allowed(app_srv, v41_tokenizer_path):
    srv = app_srv[0]
    body = json.dumps(CHAT).encode()
    foreign = {**JSON, "origin": "http://evil.example"}
    status, _, reply = parse_response(_post(srv.port, "/v1/chat/completions", body, foreign))
    assert status == 403
    assert "evil.example" in json.loads(reply)["error"]["message"]
    status, _, reply = parse_response(_post(srv.port, "/v1/messages", body, foreign))
    assert (status, json.loads(reply)["error"]["type"]) == (403, "permission_error")
    same = {**JSON, "origin": f"http://127.0.0.1:{srv.port}"}
    assert parse_response(_post(srv.port, "/v1/chat/completions", body, same))[0] == 200

    allowed, _, _ = app_server(
        str(v41_tokenizer_path), LIMITS, allowed_origins=("https://app.example",)
    )
    try:
        ok = {**JSON, "origin": "https://app.example"}
        status, headers, _ = parse_response(_post(allowed.port, "/v1/chat/completions", body, ok))
        assert status == 200
        assert headers["access-control-allow-origin"] == "https://app.example"
        preflight = (
            b"OPTIONS /v1/chat/completions HTTP/1.1\r\nhost: x\r\norigin: https://app.example\r\n"
            b"access-control-request-method: POST\r\naccess-control-request-headers: "
            b"content-type\r\nconnection: close\r\n\r\n"
        )
        status, headers, _ = parse_response(exchange(allowed, preflight))
        assert status == 204
        assert "POST" in headers["access-control-allow-methods"]
        assert parse_response(_post(allowed.port, "/v1/chat/completions", body, foreign))[0] == 403
    finally:
        allowed.stop()


def test_the_official_sdks_still_work(app_srv):
    import anthropic
    import openai

    srv = app_srv[0]
    url = f"http://127.0.0.1:{srv.port}"
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
        r = c.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=8)
        assert r.choices[0].message.content == "Hello there."
    with anthropic.Anthropic(base_url=url, api_key="x", max_retries=0) as c:
        m = c.messages.create(model="tiny", messages=CHAT["messages"], max_tokens=8)
        assert m.content[0].text == "Hello there."


def _body_of_tokens(app, n: int) -> dict:
    """A chat body without max_tokens whose prompt is exactly n tokens."""
    from deepring.protocol.prepare import CHAT as CHAT_API

    def body(words: int) -> dict:
        return {"model": "tiny", "messages": [{"role": "user", "content": "a " * words}]}

    base = len(app.recipe.encode(CHAT_API, body(1)))
    out = body(1 + n - base)
    assert len(app.recipe.encode(CHAT_API, out)) == n
    return out


def test_a_prompt_that_fills_the_context_is_a_400(app_srv):
    srv, app, _ = app_srv
    for path, key in (("/v1/chat/completions", "error"), ("/v1/messages", "error")):
        full = _body_of_tokens(app, 64)
        if path == "/v1/messages":
            full["max_tokens"] = 1
        status, _, reply = parse_response(_post(srv.port, path, json.dumps(full).encode(), JSON))
        assert status == 400
        message = json.loads(reply)[key]["message"]
        assert "context length" in message
        for internal in ("prefill", "decode", "worker"):
            assert internal not in message
    fits = _body_of_tokens(app, 63)
    status, _, _ = parse_response(
        _post(srv.port, "/v1/chat/completions", json.dumps(fits).encode(), JSON)
    )
    assert status == 200


def test_a_prompt_too_long_to_fit_is_refused_before_it_is_encoded(app_srv, monkeypatch):
    srv, app, _ = app_srv

    def no_encoding(conv):
        raise AssertionError("encoded a prompt the length bound refuses")

    monkeypatch.setattr(app.recipe, "_encode", no_encoding)
    # 64 tokens x 128 bytes per token at most: 8,192 characters cannot fit.
    long = {"model": "tiny", "messages": [{"role": "user", "content": "word " * 40_000}]}
    took, reply = timed(
        lambda: _post(srv.port, "/v1/chat/completions", json.dumps(long).encode(), JSON)
    )
    status, _, body = parse_response(reply)
    assert status == 400
    assert "at least" in json.loads(body)["error"]["message"]
    assert took < 2


_APP_SERVER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from http_helpers import app_server
from deepring.frontend.http import HttpLimits
limits = HttpLimits(max_body_bytes=16 << 20, header_timeout=5, body_timeout=5)
srv, _, _ = app_server(sys.argv[2], limits, max_model_len=4096, use_uvloop=True)
print(srv.port, flush=True)
time.sleep(3600)
"""


def test_health_stays_fast_while_big_prompts_are_prepared(v41_tokenizer_path):
    """16 requests of 8 MB each at once (their prompts cannot fit a 4096-token context):
    /health keeps answering. Bodies are parsed and their prompts bounded on worker threads,
    without building Python strings of them; the event loop only moves bytes. The server runs
    in its own process, as `deepring serve`'s frontend does, so the test's own threads do not
    compete with it for the GIL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _APP_SERVER, str(Path(__file__).parent), str(v41_tokenizer_path)],
        stdout=subprocess.PIPE,
    )
    try:
        port = int(proc.stdout.readline())
        text = "lorem ipsum dolor sit amet " * (8_000_000 // 27)
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": text}]})
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            f"\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        statuses: list[int] = []
        load = threading.Thread(
            target=lambda: statuses.extend(
                send_all_at_once(port, head.encode() + body.encode(), 16)
            )
        )
        probe = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"

        def health() -> float:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                took, reply = timed(lambda: (s.sendall(probe), read_all(s))[1])
            assert parse_response(reply)[0] == 200
            return took

        idle = [health() for _ in range(20)]
        latencies = []
        load.start()
        while load.is_alive():
            latencies.append(health())
            time.sleep(0.005)
        load.join()
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
    assert statuses == [400] * 16
    latencies.sort()
    worst = latencies[-1]
    print(
        f"/health: idle p50 {statistics.median(idle) * 1e3:.1f} ms; under 16 x 8 MB "
        f"{len(latencies)} probes, p50 {statistics.median(latencies) * 1e3:.1f} ms, "
        f"max {worst * 1e3:.1f} ms"
    )
    assert worst < 1.0  # generous for a loaded 2-core machine; see docs/architecture.md
