"""Where a request's tokens go: an SSE stream or an accumulated JSON response.

Both turn the engine's token ids into the request's protocol events (protocol.output: the
StreamProcessor decodes, parses reasoning / content / tool calls, matches stop sequences) and
either frame each event as SSE and write it, or accumulate the events into the protocol's
response object. A batch of tokens is pushed as one chunk, so a busy frontend emits fewer,
larger events.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from deepring.frontend.http import HttpRequest
from deepring.protocol.errors import anthropic_error, openai_error
from deepring.protocol.output import ready_events, token_events
from deepring.protocol.prepare import MESSAGES, RESPONSES, Prepared

log = logging.getLogger("deepring.frontend")


class _Base:
    def __init__(self, http: HttpRequest, prep: Prepared, eos_ids: frozenset[int]) -> None:
        self.http = http
        self.prep = prep
        self.eos_ids = eos_ids
        self.closed = False

    def _ready_events(self, cache_hit: int) -> list:
        return ready_events(self.prep, cache_hit)

    def _token_events(
        self, ids: list[int], finish: str | None, logprobs: list | None
    ) -> tuple[list, bool]:
        return token_events(self.prep, ids, finish, self.eos_ids, logprobs)


class SseSink(_Base):
    """Server-sent events, written as they come."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        cls = self.prep.api.response
        self._name = cls.sse_event_name
        done = cls.sse_done_data()
        self._done = f"data: {done}\n\n".encode() if done is not None else b""
        self._sequence = 0  # Responses events carry a sequence number

    def _frames(self, events: list) -> bytes:
        name_of = self._name
        parts = []
        for e in events:
            name = name_of(e)
            parts.append(
                f"event: {name}\ndata: {e.to_json()}\n\n" if name else f"data: {e.to_json()}\n\n"
            )
        self._sequence += len(events)
        return "".join(parts).encode()

    def start(self, cache_hit: int) -> None:
        try:
            first = self._frames(self._ready_events(cache_hit))
        except RuntimeError as e:
            self._internal(e)
            return
        self.http.start_stream(headers=[("x-request-id", self.prep.response_id)], first=first)

    def tokens(self, ids: list[int], finish: str | None, logprobs: list | None = None) -> bool:
        if self.closed:
            return True
        try:
            events, over = self._token_events(ids, finish, logprobs)
        except RuntimeError as e:
            self._internal(e)
            return True
        data = self._frames(events)
        if over:
            self.closed = True
            self.http.end_stream(data + self._done)
        elif data:
            self.http.write(data)
        return over

    def _internal(self, e: Exception) -> None:
        log.error("stream processing failed for %s: %s", self.prep.response_id, e)
        self.error(f"internal error while streaming the response: {e}")

    def error(self, message: str, status: int = 500) -> None:
        """An error event in the protocol's own form, then the end of the stream. With another
        status than 500 and nothing streamed yet (the request never reached a worker), a plain
        HTTP error response of that status instead."""
        if self.closed:
            return
        self.closed = True
        self.prep.processor.close()
        api = self.prep.api
        if status != 500 and not self.http.started:
            body = (
                anthropic_error(status, message)
                if api is MESSAGES
                else openai_error(status, message)
            )
            self.http.respond(status, json.dumps(body).encode())
            return
        if api is MESSAGES:
            body = anthropic_error(500, message)
            frame = f"event: error\ndata: {json.dumps(body)}\n\n"
        elif api is RESPONSES:
            body = {
                "type": "error",
                "code": "server_error",
                "message": message,
                "param": None,
                "sequence_number": self._sequence,
            }
            frame = f"event: error\ndata: {json.dumps(body)}\n\n"
        else:
            frame = f"data: {json.dumps(openai_error(500, message))}\n\n"
        if not self.http.started:
            self.http.start_stream(headers=[("x-request-id", self.prep.response_id)])
        self.http.end_stream(frame.encode())


class JsonSink(_Base):
    """A non-streaming response: events accumulate into the protocol's response object."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.response = None

    def start(self, cache_hit: int) -> None:
        p = self.prep
        self.response = p.api.response(
            p.response_id, p.model, p.created, len(p.prompt_ids), cache_hit
        )
        try:
            self._accumulate(self._ready_events(cache_hit))
        except RuntimeError as e:
            self._internal(e)

    def _accumulate(self, events: list) -> None:
        acc = self.response.accumulate  # type: ignore[union-attr]
        for e in events:
            acc(e)

    def tokens(self, ids: list[int], finish: str | None, logprobs: list | None = None) -> bool:
        if self.closed:
            return True
        try:
            events, over = self._token_events(ids, finish, logprobs)
            self._accumulate(events)
        except RuntimeError as e:
            self._internal(e)
            return True
        if over:
            self.closed = True
            body = self.response.to_json().encode()  # type: ignore[union-attr]
            self.http.respond(200, body, headers=[("x-request-id", self.prep.response_id)])
        return over

    def _internal(self, e: Exception) -> None:
        log.error("response accumulation failed for %s: %s", self.prep.response_id, e)
        self.error(f"internal error while building the response: {e}")

    def error(self, message: str, status: int = 500) -> None:
        if self.closed:
            return
        self.closed = True
        self.prep.processor.close()
        body = (
            anthropic_error(status, message)
            if self.prep.api is MESSAGES
            else openai_error(status, message)
        )
        if not self.http.started:
            self.http.respond(status, json.dumps(body).encode())
