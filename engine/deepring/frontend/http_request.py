"""One HTTP request as a handler sees it, and the response it writes: complete, or streamed.

A response goes out as one write of head + body, or as a chunked stream whose head travels
with its first chunk; each later chunk is one `transport.write`. A HEAD request gets the head
GET would get (the same status, fields and Content-Length, RFC 9110 9.3.2) and no content.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Protocol


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class Connection(Protocol):
    """What a request needs from its connection."""

    closed: bool

    def write(self, data: bytes) -> None: ...
    def request_done(self, req: HttpRequest) -> None: ...


class HttpRequest:
    __slots__ = (
        "_conn",
        "_state",
        "body",
        "extra_headers",
        "headers",
        "keep_alive",
        "method",
        "on_disconnect",
        "path",
        "query",
        "sse",
    )

    def __init__(
        self,
        conn: Connection,
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
        # Fields every response to this request carries (the app's CORS fields, for one).
        self.extra_headers: list[tuple[str, str]] | None = None
        self.sse = False  # the response is an event stream (SSE comments may be sent)
        self._state = "new"  # new | streaming | done

    @property
    def done(self) -> bool:
        return self._state == "done"

    @property
    def disconnected(self) -> bool:
        return self._conn.closed

    @property
    def started(self) -> bool:
        return self._state != "new"

    def _head(self, status: int, headers: list[tuple[str, str]], framing: str) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason(status)}", "server: deepring"]
        if framing:
            lines.append(framing)
        if not self.keep_alive:
            lines.append("connection: close")
        lines.extend(f"{k}: {v}" for k, v in headers)
        if self.extra_headers:
            lines.extend(f"{k}: {v}" for k, v in self.extra_headers)
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
        self._state = "done"
        if status == 204:  # no content, and no Content-Length either (RFC 9110 8.6)
            head = self._head(status, headers or [], "")
            body = b""
        else:
            hdrs = [("content-type", content_type), *(headers or [])]
            head = self._head(status, hdrs, f"content-length: {len(body)}")
        self._conn.write(head if self.method == "HEAD" else head + body)
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
        self.sse = content_type.startswith("text/event-stream")
        hdrs = [("content-type", content_type), ("cache-control", "no-cache"), *(headers or [])]
        head = self._head(status, hdrs, "transfer-encoding: chunked")
        if self.method == "HEAD":
            self._conn.write(head)
            return
        self._conn.write(head + (b"%x\r\n%s\r\n" % (len(first), first) if first else b""))

    def write(self, data: bytes) -> None:
        """One chunk of a streaming response (nothing when the client is gone)."""
        if self._state != "streaming":
            raise RuntimeError("write() needs a started stream")
        if data and self.method != "HEAD":
            self._conn.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self, last: bytes = b"") -> None:
        if self._state != "streaming":
            raise RuntimeError("end_stream() needs a started stream")
        self._state = "done"
        if self.method != "HEAD":
            self._conn.write((b"%x\r\n%s\r\n" % (len(last), last) if last else b"") + b"0\r\n\r\n")
        self._conn.request_done(self)
