"""A small HTTP/1.1 server on asyncio, built for token streaming and for hostile clients.

Why not an ASGI stack: a streamed token costs one `transport.write` here, written straight from
the ring's read callback, with no per-chunk coroutine, queue or ASGI message in between. That
per-token overhead is what bounds the frontend at high concurrency on few cores.

What it does: keep-alive and pipelining (one request at a time, answered in order; bytes of
the next requests wait unparsed, and reading pauses while they pile up), Content-Length and
chunked request bodies, `Expect: 100-continue`, fixed-length and chunked responses, HEAD, and
a disconnect callback per request so an abandoned stream is aborted at once. Parsing is in
http_parse (strict, bounded), the response side in http_request.

Limits, each answered and the connection closed (see docs/architecture.md):
- size: request line 8 KiB (414), header line 16 KiB, head 64 KiB, 100 fields (431), body
  `max_body_bytes` (413, before the body is read when Content-Length says so);
- time: a head must arrive within `header_timeout` of its first byte, and a fresh connection
  must send one within that time; a body may pause at most `body_timeout` between bytes (408);
  an idle keep-alive connection closes after `keepalive_timeout`;
- slow readers: writes never wait (see above), so the bound is on what the client leaves
  unread: past MAX_WRITE_BUFFER, or when it reads nothing for `write_timeout` while the
  transport holds more than its high-water mark, the connection is dropped and its request
  aborted (a slow reader that keeps reading is kept);
- connections: at most `max_connections`; each one beyond is answered 503 with Retry-After
  and closed. Answering (rather than leaving it in the listen backlog) tells a client at once
  that this server is full, so it can go elsewhere or retry, instead of timing out on a
  connection that was never accepted. accept() itself failing (EMFILE) neither stops nor spins
  the server: uvloop (libuv) sheds the connection, and on asyncio's own loop, whose accepting
  spins on EMFILE, an Acceptor (accept.py) pauses accepting for a moment instead.

Disconnects: a client that half-closes (shutdown(SHUT_WR)) after a complete request still gets
its response; only a reset, or a failed write after EOF, is a disconnect. EOF alone cannot tell
a half-close from a close, so after EOF an event stream in progress is sent an SSE comment
every PROBE_INTERVAL: to a closed client that write fails, and the request is aborted. (A
response that is not streaming yet cannot be probed; it completes, then the connection closes.)

Handlers are `async def handler(request)`; a handler may return before its response is
complete (a stream finishes later, from the ring callback). The connection takes the next
request only when the current response is complete.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from deepring.frontend.accept import Acceptor, loop_sheds_emfile
from deepring.frontend.http_limits import HttpLimits, default_max_connections, fd_budget
from deepring.frontend.http_parse import (
    ChunkedBody,
    HttpError,
    RequestHead,
    check_partial_head,
    find_head_end,
    parse_head,
)
from deepring.frontend.http_request import HttpRequest, reason

log = logging.getLogger("deepring.http")

# A streaming client that leaves this much unread is treated as gone.
MAX_WRITE_BUFFER = 32 << 20
# Bytes of pipelined requests held behind the one in progress before reading pauses.
MAX_PIPELINED_BYTES = 256 << 10
# How long a connection refused with an answer stays open (its input discarded) so the client
# can read the answer before the close: closing with unread input would reset the connection
# and could destroy the answer in flight.
LINGER = 2.0
# After a client's EOF, how often a running event stream checks that the client is still there.
PROBE_INTERVAL = 1.0
PROBE = b": ping\n\n"

Handler = Callable[[HttpRequest], Awaitable[None]]
# What deepring_http_refused_total calls a request refused with this status (others: malformed).
_REFUSED_FOR = {413: "body_too_large", 414: "head_too_large", 431: "head_too_large"}

# (path, status, message) -> JSON body of an error the server itself produces (400, 413, ...).
ErrorBody = Callable[[str, int, str], bytes]

# What the read-side timer of a connection watches.
_IDLE, _HEAD, _BODY, _BUSY, _LINGER = range(5)


class HttpConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.active: HttpRequest | None = None
        self._buf = bytearray()  # received, not yet parsed
        self._scanned = 0  # bytes of _buf already searched for the end of the head
        self._head: RequestHead | None = None  # parsed; its body is being read
        self._chunked: ChunkedBody | None = None
        # A Content-Length body: its chunks as they arrive (joined once: no copying of a
        # growing buffer), and how many bytes are still to come.
        self._parts: list[bytes] = []
        self._need = 0
        self._body = b""
        self._eof = False  # the client will send nothing more
        self._paused = False
        self._mode = _IDLE
        self._deadline = 0.0
        self._last_byte = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._write_timer: asyncio.TimerHandle | None = None
        self._written = 0  # bytes handed to the transport (write()); what was sent follows
        self._sent_mark = 0  # bytes sent when the write timer was armed
        self._probe: asyncio.Handle | None = None

    # ---- the connection ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.server.connections) >= self.limits.max_connections:
            self._turn_away()
            return
        self.server.connections.add(self)
        self._watch(_IDLE, self.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        mode = self._mode
        if mode == _LINGER:
            return
        need = self._need
        if need:  # the rest of a Content-Length body
            self._last_byte = self.loop.time()
            if len(data) < need:
                self._parts.append(data)
                self._need = need - len(data)
                return
            self._parts.append(data if len(data) == need else data[:need])
            data = data[need:]
            self._need = 0
        elif mode == _BODY:
            self._last_byte = self.loop.time()
        if data:
            self._buf += data
        if self.active is not None:
            if len(self._buf) > MAX_PIPELINED_BYTES:
                self._pause()
            return
        self._process()

    def eof_received(self) -> bool:
        self._eof = True
        if self.active is None or self._mode == _LINGER:
            # Nothing in progress, so what is buffered is an incomplete request: close.
            return False
        # A request is in progress and the client may only have half-closed: keep writing.
        if self._probe is None:
            self._probe = self.loop.call_soon(self._send_probe)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for handle in (self._timer, self._write_timer, self._probe):
            if handle is not None:
                handle.cancel()
        self.server.connections.discard(self)
        self.server.turned_away.discard(self)
        self._buf = bytearray()
        req = self.active
        if req is not None and not req.done and req.on_disconnect is not None:
            callback, req.on_disconnect = req.on_disconnect, None
            callback()

    # ---- requests ------------------------------------------------------------------------------

    def _process(self) -> None:
        """Parse and start requests from the buffer while none is in progress."""
        try:
            while self.active is None and self._mode != _LINGER:
                head = self._head
                if head is None:
                    head = self._take_head()
                    if head is None:
                        break
                if not self._take_body(head):
                    break
                self._dispatch(head)
        except HttpError as e:
            self._fatal(e.status, e.message, _REFUSED_FOR.get(e.status, "malformed"))
            return
        if self.active is None and self._eof and self._mode != _LINGER:
            self.close()  # the client sent all it will; what is left can never complete

    def _take_head(self) -> RequestHead | None:
        buf = self._buf
        if self._scanned == 0:
            # Empty lines before a request line are ignored (RFC 9112 2.2).
            while buf[:2] == b"\r\n":
                del buf[:2]
        if not buf:
            return None
        end = find_head_end(buf, self._scanned)
        if end < 0:
            check_partial_head(buf, self._scanned)
            self._scanned = len(buf)
            if self._mode != _HEAD:
                self._watch(_HEAD, self.limits.header_timeout)
            return None
        data = bytes(buf[:end])
        del buf[: end + 4]
        self._scanned = 0
        self._head = head = parse_head(data)
        limit = self.limits.max_body_bytes
        if head.content_length > limit:
            raise HttpError(
                413,
                f"request body is too large ({head.content_length} bytes; "
                f"the limit is {limit} bytes)",
            )
        waiting = (not buf) if head.chunked else len(buf) < head.content_length
        if head.expect_continue and waiting and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if head.chunked:
            self._chunked = ChunkedBody(limit)
        elif head.content_length:
            k = min(head.content_length, len(buf))
            self._parts = [bytes(buf[:k])] if k else []
            del buf[:k]
            self._need = head.content_length - k
        return head

    def _take_body(self, head: RequestHead) -> bool:
        if self._chunked is not None:
            if not self._chunked.feed(self._buf):
                return self._await_body()
            self._body = bytes(self._chunked.data)
            self._chunked = None
        elif head.content_length:
            if self._need:
                return self._await_body()
            parts, self._parts = self._parts, []
            self._body = parts[0] if len(parts) == 1 else b"".join(parts)
        return True

    def _await_body(self) -> bool:
        if self._mode != _BODY:
            self._watch(_BODY, self.limits.body_timeout)
        return False

    def _dispatch(self, head: RequestHead) -> None:
        body, self._body, self._head = self._body, b"", None
        req = HttpRequest(
            self, head.method, head.path, head.query, head.headers, body, head.keep_alive
        )
        self.active = req
        self._mode = _BUSY
        task = self.loop.create_task(self.server.handler(req))
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
        self._watch(_IDLE, self.limits.keepalive_timeout)
        self._process()  # a pipelined request may be waiting
        if self._paused and (self.active is None or len(self._buf) <= MAX_PIPELINED_BYTES):
            self._resume()

    def _fatal(self, status: int, message: str, reason: str) -> None:
        """Answer a request that cannot be parsed or accepted, then close the connection.
        reason: what the server's refusal counter calls it."""
        if self.transport is None or self.closed:
            return
        self.server.refused[reason] += 1
        head = self._head
        body = self.server.error_body(head.path if head else "/", status, message)
        # A 405 must say which methods are allowed (RFC 9110 15.5.6): here, for a method no
        # route takes (CONNECT), the ones the server's routes use.
        extra = "allow: GET, HEAD, POST, OPTIONS\r\n" if status == 405 else ""
        self.transport.write(
            _error_head(status, len(body), extra)
            + (b"" if head and head.method == "HEAD" else body)
        )
        self._linger()

    def _turn_away(self) -> None:
        """Over the connection cap: answer 503 and close (or, when even the connections being
        turned away pile up, drop it without an answer)."""
        srv = self.server
        t = self.transport
        if t is None:
            return
        srv.refused["connection_limit"] += 1
        if len(srv.turned_away) >= max(16, self.limits.max_connections // 8):
            t.abort()
            return
        srv.turned_away.add(self)
        body = srv.error_body("/", 503, "the server has too many open connections; retry later")
        t.write(_error_head(503, len(body), "retry-after: 1\r\n") + body)
        self._linger()

    # ---- writing -------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is None or self.closed:
            return
        t.write(data)
        self._written += len(data)
        if t.get_write_buffer_size() > MAX_WRITE_BUFFER:
            log.warning("client stopped reading; dropping its connection")
            t.abort()

    def pause_writing(self) -> None:
        # The transport's buffer is over its high-water mark: from now on the client must
        # read something every write_timeout.
        self._arm_write_timer()

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _sent(self) -> int:
        t = self.transport
        return self._written - (t.get_write_buffer_size() if t is not None else 0)

    def _arm_write_timer(self) -> None:
        if self._write_timer is None:
            self._sent_mark = self._sent()
            timeout = self.limits.write_timeout
            self._write_timer = self.loop.call_later(timeout, self._write_expired)

    def _write_expired(self) -> None:
        self._write_timer = None
        t = self.transport
        if t is None or self.closed or not t.get_write_buffer_size():
            return
        if self._sent() > self._sent_mark:  # slow, but reading: give it another period
            self._arm_write_timer()
            return
        log.warning(
            "client read nothing for %.0fs; dropping its connection", self.limits.write_timeout
        )
        self.server.refused["slow_reader"] += 1
        t.abort()

    def _send_probe(self) -> None:
        self._probe = None
        req = self.active
        if self.closed or req is None:
            return
        if req.sse and req.started and not req.done and req.method != "HEAD":
            self.write(b"%x\r\n%s\r\n" % (len(PROBE), PROBE))
        self._probe = self.loop.call_later(PROBE_INTERVAL, self._send_probe)

    def close(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()
            # close() waits for the buffer to drain: a client that never reads must not hold
            # the connection forever.
            if t.get_write_buffer_size():
                self._arm_write_timer()

    # ---- flow control and timers ---------------------------------------------------------------

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True

    def _resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()
            self._paused = False

    def _linger(self) -> None:
        """Refuse further input: half-close, discard what comes, close within LINGER."""
        t = self.transport
        if t is None:
            return
        self._buf = bytearray()
        self._head = self._chunked = None
        self._parts, self._need = [], 0
        if t.can_write_eof():
            t.write_eof()
        self._resume()
        self._watch(_LINGER, LINGER)

    def _watch(self, mode: int, timeout: float) -> None:
        """Set what the read timer watches; one timer per connection, re-armed lazily."""
        self._mode = mode
        if timeout <= 0:
            self._deadline = float("inf")
            return
        now = self.loop.time()
        self._deadline = now + timeout
        if mode == _BODY:
            self._last_byte = now
        if self._timer is None or self._timer_at > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(self._deadline)

    def _arm(self, at: float) -> None:
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        mode = self._mode
        if self.closed or mode == _BUSY:
            return
        body = mode == _BODY
        deadline = self._last_byte + self.limits.body_timeout if body else self._deadline
        if deadline == float("inf"):
            return
        if deadline - self.loop.time() > 0.001:
            self._arm(deadline)
        elif mode == _IDLE:
            self.close()
        elif mode == _HEAD:
            self._fatal(408, "the request head did not arrive in time", "header_timeout")
        elif mode == _BODY:
            self._fatal(408, "the request body stopped arriving", "body_timeout")
        elif self.transport is not None:  # _LINGER
            self.transport.abort()

    @property
    def idle(self) -> bool:
        return self.active is None and self._head is None and not self._buf


def _error_head(status: int, length: int, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} {reason(status)}\r\nserver: deepring\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n"
        f"connection: close\r\n{extra}\r\n"
    ).encode("latin-1")


class HttpServer:
    def __init__(
        self, handler: Handler, error_body: ErrorBody, limits: HttpLimits | None = None
    ) -> None:
        self.handler = handler
        self.error_body = error_body
        self.limits = limits or HttpLimits()
        self.connections: set[HttpConnection] = set()
        self.turned_away: set[HttpConnection] = set()  # over the cap, being answered 503
        # Connections refused or dropped by the limits, by reason (deepring_http_refused_total).
        self.refused: Counter[str] = Counter()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._acceptor: Acceptor | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port."""
        self.loop = loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self), host, port, reuse_address=True, backlog=2048
        )
        if not loop_sheds_emfile(loop):
            fds = [s.fileno() for s in self._server.sockets]
            self._acceptor = Acceptor(loop, fds, lambda: HttpConnection(self))
        return self._server.sockets[0].getsockname()[1]

    def stop_listening(self) -> None:
        """Refuse new connections and close idle keep-alive ones; active ones finish."""
        if self._acceptor is not None:
            self._acceptor.close()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.idle:
                conn.close()

    def close_all(self) -> None:
        for conn in [*self.connections, *self.turned_away]:
            conn.close()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()


__all__ = ["HttpLimits", "HttpRequest", "HttpServer", "default_max_connections", "fd_budget"]
