"""The wire: requests over plain HTTP and a strict reading of server-sent events.

The point of a conformance run is the bytes a server sends, so this uses http.client (one
keep-alive connection per client) rather than an SDK that would smooth them over: an SDK
accepts a stream without its `[DONE]`, or with a stray line, and a property could never see it.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


@dataclass
class Event:
    """One SSE event: its `event:` name (None without one) and its `data:` text."""

    name: str | None
    data: str
    json: Any = None  # the parsed data, None for `[DONE]` or data that is not JSON


@dataclass
class Exchange:
    """One request and what came back."""

    protocol: str
    body: Any  # the body sent (a dict, or the exact str / bytes)
    status: int = 0
    content_type: str = ""
    raw: bytes = b""
    error: str | None = None  # the transport failed (refused, reset, timed out)
    json: Any = None  # the parsed JSON body (non-streamed), None when it is not JSON
    events: list[Event] = field(default_factory=list)  # streamed
    framing: list[str] = field(default_factory=list)  # SSE framing problems

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300

    @property
    def streamed(self) -> bool:
        return self.content_type.partition(";")[0].strip().lower() == "text/event-stream"


class Client:
    """POSTs request bodies to one server (not thread-safe: one client per thread)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 120.0) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--base-url must be http(s)://host[:port][/prefix], got {base_url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        # A base URL that ends in /v1 (what SDKs take) names the same routes.
        if self.prefix.endswith("/v1"):
            self.prefix = self.prefix[: -len("/v1")]
        self.api_key = api_key
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def headers(self, protocol: str) -> dict[str, str]:
        h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if self.api_key:
            # Both schemes: an OpenAI-compatible server reads the bearer token, Anthropic's
            # routes read x-api-key.
            h["authorization"] = f"Bearer {self.api_key}"
            h["x-api-key"] = self.api_key
        if protocol == "messages":
            h["anthropic-version"] = "2023-06-01"
        return h

    def get_json(self, path: str) -> Any:
        """GET a JSON document; None when the server has none there (the route is optional).
        OSError when the server cannot be reached; PermissionError when it refuses the
        credentials (401 / 403: no run can start without them)."""
        try:
            status, _, raw = self._round_trip("GET", self.prefix + path, None, self.headers(""))
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise OSError(f"cannot reach {self.host}:{self.port}: {e}") from e
        if status in (401, 403):
            hint = "pass --api-key" if not self.api_key else "the --api-key was refused"
            raise PermissionError(f"GET {path} answered HTTP {status}: {hint}")
        if status != 200:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def post(self, protocol: str, body: Any) -> Exchange:
        ex = Exchange(protocol, body)
        data = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) else None
        if data is None:
            data = json.dumps(body, ensure_ascii=False).encode()
        try:
            ex.status, ex.content_type, ex.raw = self._round_trip(
                "POST", self.prefix + PATHS[protocol], data, self.headers(protocol)
            )
        except (OSError, http.client.HTTPException) as e:
            self.close()  # the connection is in an unknown state
            ex.error = f"{type(e).__name__}: {e}"
            return ex
        if ex.streamed:
            ex.events, ex.framing = parse_sse(ex.raw)
        else:
            try:
                ex.json = json.loads(ex.raw)
            except ValueError:
                ex.json = None
        return ex

    def _round_trip(
        self, method: str, path: str, data: bytes | None, headers: dict[str, str]
    ) -> tuple[int, str, bytes]:
        # One retry on a fresh connection: a keep-alive connection the server closed while it
        # was idle fails on its next use without the request having been read.
        for attempt in range(2):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 1:
                    raise
                continue
            except TimeoutError:
                self.close()
                raise
            if resp.getheader("connection", "").lower() == "close":
                self.close()
            return resp.status, resp.getheader("content-type", ""), raw
        raise AssertionError("unreachable")  # the loop returns or raises


def parse_sse(raw: bytes) -> tuple[list[Event], list[str]]:
    """Events of an SSE body and the framing problems found (empty for a clean stream).

    Strict where the format is: UTF-8, lines of `field: value` (or `:` comments), events
    separated by one empty line, the last one terminated too; one `event` name per event; data
    JSON (its lines joined, as SSE says), except the literal `[DONE]`."""
    problems: list[str] = []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return [], [f"the stream is not UTF-8: {e}"]
    text = text.replace("\r\n", "\n")
    if text and not text.endswith("\n\n"):
        problems.append(f"the stream ends inside an event: {text[-80:]!r}")
    events: list[Event] = []
    for block in text.split("\n\n"):
        if not block.strip("\n"):
            continue
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith(":"):
                continue  # a comment (keep-alive)
            key, sep, value = line.partition(":")
            if not sep:
                problems.append(f"a line that is no SSE field: {line[:80]!r}")
                continue
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                if name is not None:
                    problems.append(f"two event names in one event: {block[:120]!r}")
                name = value
            elif key == "data":
                data.append(value)
            elif key not in ("id", "retry"):
                problems.append(f"unknown SSE field {key!r}")
        if not data:
            if name is not None:
                problems.append(f"an event without data: {block[:120]!r}")
            continue
        event = Event(name, "\n".join(data))
        if event.data != "[DONE]":
            try:
                event.json = json.loads(event.data)
            except ValueError:
                problems.append(f"event data that is not JSON: {event.data[:120]!r}")
        events.append(event)
    return events, problems
