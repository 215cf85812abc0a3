"""Parsing HTTP/1.1 requests for the frontend's server: the head and the body's framing.

Strict, because the server may sit behind a proxy, and every leniency where two parsers can
disagree on where a request ends is a request-smuggling vector: Content-Length together with
Transfer-Encoding, Content-Lengths that differ, a transfer coding other than exactly `chunked`,
a malformed chunk size, a bare LF, a folded header line, whitespace before a colon. Each is an
HttpError (400), after which the connection answers and closes.

Bounded and linear, because a hostile client must cost little: the request line (8 KiB, else
414), each header line (16 KiB), the whole head (64 KiB) and the number of header lines (100)
are capped (431 beyond), and the connection finds the end of the head by scanning only the bytes
that arrived since the last scan (`find_head_end`), never the whole buffer again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_REQUEST_LINE = 8 << 10
MAX_HEADER_LINE = 16 << 10
MAX_HEAD_BYTES = 64 << 10
MAX_HEADERS = 100
# A chunk-size line: up to 16 hex digits plus chunk extensions, which this server ignores.
MAX_CHUNK_LINE = 4 << 10

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Control bytes other than HTAB. In a header value (lines are split at CRLF) this also catches
# a bare CR or LF, and NUL.
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# A request target holds no whitespace or control byte.
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,18}")
_VERSION = re.compile(rb"HTTP/[0-9]\.[0-9]")


class HttpError(Exception):
    """A request the server answers itself (status and message), then closes the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def malformed(what: str) -> HttpError:
    return HttpError(400, f"malformed HTTP request: {what}")


@dataclass(slots=True)
class RequestHead:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    keep_alive: bool
    content_length: int  # 0 when the request has no body or a chunked one
    chunked: bool
    expect_continue: bool


def find_head_end(buf: bytearray, scanned: int) -> int:
    """Where the head's CRLFCRLF starts in buf, or -1; `scanned` bytes were searched before
    (only the last three are looked at again, in case the terminator straddles them)."""
    return buf.find(b"\r\n\r\n", max(0, scanned - 3))


def check_partial_head(buf: bytearray, scanned: int) -> None:
    """Limits on a head that has not ended yet: raises once it can no longer fit."""
    if scanned <= MAX_REQUEST_LINE:
        # Still within the first line's allowance: the request line must end in time.
        nl = buf.find(b"\n", 0, MAX_REQUEST_LINE + 2)
        if nl < 0 and len(buf) > MAX_REQUEST_LINE:
            raise HttpError(414, f"the request line is longer than {MAX_REQUEST_LINE} bytes")
        if nl >= 0 and (nl == 0 or buf[nl - 1] != 0x0D):
            raise malformed("the request line must end with CRLF")
    if len(buf) > MAX_HEAD_BYTES:
        raise HttpError(431, f"the request head is larger than {MAX_HEAD_BYTES} bytes")


def parse_head(data: bytes) -> RequestHead:
    """The request line and header fields of one request (data without the final CRLFCRLF)."""
    line_end = data.find(b"\r\n", 0, MAX_REQUEST_LINE + 2)
    if line_end < 0 and len(data) > MAX_REQUEST_LINE:
        raise HttpError(414, f"the request line is longer than {MAX_REQUEST_LINE} bytes")
    if len(data) > MAX_HEAD_BYTES:
        raise HttpError(431, f"the request head is larger than {MAX_HEAD_BYTES} bytes")
    lines = data.split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, f"more than {MAX_HEADERS} header fields")
    method, path, query, http11 = _request_line(lines[0])
    headers: dict[str, str] = {}
    lengths: list[str] = []
    hosts = 0
    for line in lines[1:]:
        if len(line) > MAX_HEADER_LINE:
            raise HttpError(431, f"a header field is longer than {MAX_HEADER_LINE} bytes")
        name, colon, value = line.partition(b":")
        # No token before the colon covers an empty line, a folded line (leading whitespace)
        # and whitespace between the name and the colon.
        if not colon or not _TOKEN.fullmatch(name):
            raise malformed(f"invalid header line {line[:64]!r}")
        value = value.strip(b" \t")
        if _CTL.search(value):
            raise malformed(f"control character in the {name.decode()} header")
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        if key == "content-length":
            lengths.extend(v.strip() for v in val.split(","))
        elif key == "host":
            hosts += 1
        headers[key] = f"{headers[key]}, {val}" if key in headers else val
    if http11 and hosts != 1:
        raise malformed("an HTTP/1.1 request needs exactly one Host header")
    content_length, chunked = _framing(headers, lengths, http11)
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep_alive = "close" not in tokens if http11 else "keep-alive" in tokens
    expect = http11 and headers.get("expect", "").strip().lower() == "100-continue"
    return RequestHead(method, path, query, headers, keep_alive, content_length, chunked, expect)


def _request_line(line: bytes) -> tuple[str, str, str, bool]:
    if len(line) > MAX_REQUEST_LINE:
        raise HttpError(414, f"the request line is longer than {MAX_REQUEST_LINE} bytes")
    parts = line.split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise malformed("invalid request line")
    method_b, target, version = parts
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        if _VERSION.fullmatch(version):
            raise HttpError(505, f"HTTP version {version.decode()} is not supported")
        raise malformed("invalid request line")
    method = method_b.decode("ascii")
    if method == "CONNECT":
        raise HttpError(405, "CONNECT is not supported: this server is not a proxy")
    if not target or _BAD_TARGET.search(target):
        raise malformed("invalid request target")
    text = target.decode("latin-1")
    if text[0] != "/":
        if text == "*" and method == "OPTIONS":
            return method, "*", "", version == b"HTTP/1.1"
        # The absolute form (what a client sends to a proxy): keep its path and query.
        scheme, sep, rest = text.partition("://")
        if not sep or scheme.lower() not in ("http", "https"):
            raise malformed("invalid request target")
        slash = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        text = rest[slash:]
        text = text if text.startswith("/") else "/" + text
    text = text.partition("#")[0]
    path, _, query = text.partition("?")
    return method, path, query, version == b"HTTP/1.1"


def _framing(headers: dict[str, str], lengths: list[str], http11: bool) -> tuple[int, bool]:
    """(content length, chunked) of the body, or HttpError where the framing is ambiguous."""
    te = headers.get("transfer-encoding")
    if te is not None:
        if lengths:
            raise malformed("Content-Length and Transfer-Encoding together")
        if not http11:
            raise malformed("Transfer-Encoding in an HTTP/1.0 request")
        if te.strip().lower() != "chunked":
            raise malformed(f"unsupported Transfer-Encoding {te!r} (only 'chunked')")
        return 0, True
    if not lengths:
        return 0, False
    if not all(_DIGITS.fullmatch(v) for v in lengths):
        raise malformed("invalid Content-Length")
    if len({int(v) for v in lengths}) != 1:
        raise malformed("differing Content-Length values")
    return int(lengths[0]), False


class ChunkedBody:
    """A chunked request body, decoded from the connection's buffer as it arrives."""

    __slots__ = ("_need", "_state", "_trailer", "data", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self._state = "size"  # size | data | crlf | trailer
        self._need = 0
        self._trailer = 0

    def feed(self, buf: bytearray) -> bool:
        """Consume what can be decoded from buf; True once the body (and trailer) is complete."""
        while True:
            state = self._state
            if state == "size":
                line = _take_line(buf, MAX_CHUNK_LINE, "chunk size line")
                if line is None:
                    return False
                size_b, _, ext = line.partition(b";")
                size_b = size_b.rstrip(b" \t")
                if not _HEX.fullmatch(size_b) or _CTL.search(ext):
                    raise malformed(f"invalid chunk size line {line[:32]!r}")
                size = int(size_b, 16)
                if size == 0:
                    self._state = "trailer"
                    continue
                if len(self.data) + size > self.limit:
                    raise HttpError(
                        413, f"request body is too large (the limit is {self.limit} bytes)"
                    )
                self._need = size
                self._state = "data"
            elif state == "data":
                take = min(self._need, len(buf))
                if take == 0:
                    return False
                self.data += buf[:take]
                del buf[:take]
                self._need -= take
                if self._need:
                    return False
                self._state = "crlf"
            elif state == "crlf":
                if len(buf) < 2:
                    return False
                if buf[:2] != b"\r\n":
                    raise malformed("chunk data not followed by CRLF")
                del buf[:2]
                self._state = "size"
            else:  # trailer fields: bounded, then ignored
                line = _take_line(buf, MAX_HEADER_LINE, "trailer field")
                if line is None:
                    return False
                if not line:
                    return True
                self._trailer += len(line) + 2
                if self._trailer > MAX_HEAD_BYTES:
                    raise HttpError(431, "the chunked body's trailer is too large")
                name, colon, _ = line.partition(b":")
                if not colon or not _TOKEN.fullmatch(name):
                    raise malformed("invalid trailer field")


def _take_line(buf: bytearray, limit: int, what: str) -> bytes | None:
    """One CRLF-terminated line taken off buf (without the CRLF), None while incomplete."""
    nl = buf.find(b"\n", 0, limit + 2)
    if nl < 0:
        if len(buf) > limit + 1:
            raise HttpError(400, f"malformed HTTP request: {what} too long")
        return None
    if nl == 0 or buf[nl - 1] != 0x0D:
        raise malformed(f"{what} must end with CRLF")
    line = bytes(buf[: nl - 1])
    del buf[: nl + 1]
    return line
