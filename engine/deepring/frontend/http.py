"""A small HTTP/1.1 server on asyncio + httptools, built for token streaming.

Why not an ASGI stack: a streamed token costs one `transport.write` here, written straight from
the ring's read callback, with no per-chunk coroutine, queue or ASGI message in between. That
per-token overhead is what bounds the frontend at high concurrency on few cores.

What it does: keep-alive (and pipelined requests, answered in order), Content-Length and
chunked request bodies with a size limit (413 before the body is read when Content-Length
says so), `Expect: 100-continue`, fixed-length and chunked (streaming) responses, idle
keep-alive timeouts, and a disconnect callback per request so an abandoned stream is aborted
at once. A client that stops reading while its buffer grows past a limit is disconnected.

Handlers are `async def handler(request)`; a handler may return before its response is
complete (a stream finishes later, from the ring callback). The connection takes the next
request only when the current response is complete.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import httptools

log = logging.getLogger("deepring.http")

MAX_HEADER_BYTES = 64 << 10
# A streaming client that leaves this much unread is treated as gone.
MAX_WRITE_BUFFER = 32 << 20

Handler = Callable[["HttpRequest"], Awaitable[None]]
# (path, status, message) -> JSON body of an error the server itself produces (400, 413, ...).
ErrorBody = Callable[[str, int, str], bytes]


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class HttpRequest:
    __slots__ = (
        "_conn",
        "_state",
        "body",
        "headers",
        "keep_alive",
        "method",
        "on_disconnect",
        "path",
        "query",
    )

    def __init__(
        self,
        conn: HttpConnection,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self._conn = conn
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # lower-case names; repeated headers joined with ", "
        self.body = body
        self.keep_alive = keep_alive
        self.on_disconnect: Callable[[], None] | None = None
        self._state = "new"  # new | streaming | done

    @property
    def done(self) -> bool:
        return self._state == "done"

    @property
    def disconnected(self) -> bool:
        return self._conn.closed

    def _head(self, status: int, headers: list[tuple[str, str]], framing: str) -> bytes:
        lines = [f"HTTP/1.1 {status} {_reason(status)}", "server: deepring", framing]
        if not self.keep_alive:
            lines.append("connection: close")
        lines.extend(f"{k}: {v}" for k, v in headers)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """A complete response with a body of known length."""
        if self._state != "new":
            raise RuntimeError("response already started")
        hdrs = [("content-type", content_type), *(headers or [])]
        self._state = "done"
        self._conn.write(self._head(status, hdrs, f"content-length: {len(body)}") + body)
        self._conn.request_done(self)

    def start_stream(
        self,
        status: int = 200,
        content_type: str = "text/event-stream",
        headers: list[tuple[str, str]] | None = None,
        first: bytes = b"",
    ) -> None:
        """Begin a chunked response (optionally with its first chunk in the same write)."""
        if self._state != "new":
            raise RuntimeError("response already started")
        self._state = "streaming"
        hdrs = [("content-type", content_type), ("cache-control", "no-cache"), *(headers or [])]
        head = self._head(status, hdrs, "transfer-encoding: chunked")
        self._conn.write(head + (b"%x\r\n%s\r\n" % (len(first), first) if first else b""))

    def write(self, data: bytes) -> None:
        """One chunk of a streaming response (nothing when the client is gone)."""
        if self._state != "streaming":
            raise RuntimeError("write() needs a started stream")
        if data:
            self._conn.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self, last: bytes = b"") -> None:
        if self._state != "streaming":
            raise RuntimeError("end_stream() needs a started stream")
        self._state = "done"
        self._conn.write((b"%x\r\n%s\r\n" % (len(last), last) if last else b"") + b"0\r\n\r\n")
        self._conn.request_done(self)

    @property
    def started(self) -> bool:
        return self._state != "new"


class HttpConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.active: HttpRequest | None = None
        self.pipeline: deque[HttpRequest] = deque()
        self._idle: asyncio.TimerHandle | None = None
        self._reset_message()
        self._refuse = False  # a fatal request error was answered: ignore further input

    # ---- parsing -------------------------------------------------------------------------------

    def _reset_message(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self._too_large = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._refuse:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fatal(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as e:
            if not self._refuse:
                self._fatal(400, f"malformed HTTP request: {e}")

    def on_message_begin(self) -> None:
        self._reset_message()
        self._disarm_idle()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            self._fatal(431, "request headers are too large")
            raise httptools.HttpParserError("headers too large")
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {val}" if key in self._headers else val

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length")
        limit = self.server.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            self._too_large = True
            self._fatal(
                413,
                f"request body is too large ({int(length)} bytes; the limit is {limit} bytes)",
            )
            raise httptools.HttpParserError("body too large")
        if self._headers.get("expect", "").lower() == "100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.server.max_body_bytes:
            limit = self.server.max_body_bytes
            self._fatal(413, f"request body is too large (the limit is {limit} bytes)")
            raise httptools.HttpParserError("body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        url = httptools.parse_url(self._url)
        req = HttpRequest(
            self,
            self.parser.get_method().decode("latin-1"),
            url.path.decode("latin-1") if url.path else "/",
            url.query.decode("latin-1") if url.query else "",
            self._headers,
            b"".join(self._body),
            self.parser.should_keep_alive(),
        )
        self._reset_message()
        if self.active is None:
            self._start(req)
        else:
            self.pipeline.append(req)
            if self.transport is not None:
                self.transport.pause_reading()

    def _fatal(self, status: int, message: str) -> None:
        """Answer a request that cannot be parsed or accepted, then close the connection."""
        self._refuse = True
        if self.transport is None or self.closed:
            return
        path = httptools.parse_url(self._url).path.decode("latin-1") if self._url else "/"
        body = self.server.error_body(path, status, message)
        head = (
            f"HTTP/1.1 {status} {_reason(status)}\r\nserver: deepring\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        ).encode("latin-1")
        if self.active is None:
            self.transport.write(head + body)
            self.transport.close()
        else:
            # Let the response in progress finish; the connection closes after it.
            self.pipeline.clear()
            self.pipeline.append(_Fatal(head + body))  # type: ignore[arg-type]

    # ---- requests ------------------------------------------------------------------------------

    def _start(self, req: HttpRequest) -> None:
        if isinstance(req, _Fatal):
            self.write(req.data)
            self.close()
            return
        self.active = req
        task = asyncio.get_running_loop().create_task(self.server.handler(req))
        task.add_done_callback(lambda t, r=req: self._handler_done(t, r))

    def _handler_done(self, task: asyncio.Task, req: HttpRequest) -> None:
        if task.cancelled():
            exc: BaseException | None = asyncio.CancelledError()
        else:
            exc = task.exception()
        if exc is None:
            return
        log.error("handler failed on %s %s", req.method, req.path, exc_info=exc)
        if not req.started and not self.closed:
            req.respond(500, self.server.error_body(req.path, 500, "internal server error"))
        elif not req.done:
            self.close()

    def request_done(self, req: HttpRequest) -> None:
        if req is not self.active:
            return
        self.active = None
        if not req.keep_alive:
            self.close()
            return
        if self.pipeline:
            self._start(self.pipeline.popleft())
            if not self.pipeline and self.transport is not None and not self.closed:
                self.transport.resume_reading()
        else:
            self._arm_idle()

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is None or self.closed:
            return
        t.write(data)
        if t.get_write_buffer_size() > MAX_WRITE_BUFFER:
            log.warning("client stopped reading; closing its connection")
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm_idle()
        self.server.connections.discard(self)
        for req in (self.active, *self.pipeline):
            if isinstance(req, HttpRequest) and not req.done and req.on_disconnect is not None:
                callback, req.on_disconnect = req.on_disconnect, None
                callback()
        self.pipeline.clear()

    # ---- idle keep-alive -----------------------------------------------------------------------

    def _arm_idle(self) -> None:
        self._disarm_idle()
        timeout = self.server.keepalive_timeout
        if timeout > 0:
            self._idle = asyncio.get_running_loop().call_later(timeout, self._idle_expired)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        if self.active is None:
            self.close()

    @property
    def idle(self) -> bool:
        return self.active is None and not self.pipeline


class _Fatal:
    """A queued error response that closes the connection when its turn comes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.done = True


class HttpServer:
    def __init__(
        self,
        handler: Handler,
        error_body: ErrorBody,
        max_body_bytes: int = 8 << 20,
        keepalive_timeout: float = 75.0,
    ) -> None:
        self.handler = handler
        self.error_body = error_body
        self.max_body_bytes = max_body_bytes
        self.keepalive_timeout = keepalive_timeout
        self.connections: set[HttpConnection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self), host, port, reuse_address=True, backlog=2048
        )
        return self._server.sockets[0].getsockname()[1]

    def stop_listening(self) -> None:
        """Refuse new connections and close idle keep-alive ones; active ones finish."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.idle:
                conn.close()

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
