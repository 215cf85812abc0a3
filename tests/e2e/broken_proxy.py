"""A deliberately broken server: a loopback HTTP proxy in front of a real `deepring serve` that
corrupts its answers in one way (the mode), for the tests of `deepring conformance`.

drop_done:     Chat streams lose their `data: [DONE]`
corrupt_delta: the first text delta of each stream gets an extra character
wrong_usage:   every usage reports 7 prompt tokens more (totals unchanged)
leak_dsml:     the DSML marker shows up in content, streamed and not

Answers are read whole from the server and sent on with a Content-Length (a stream arrives at
once: the properties under test do not depend on timing).
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

MODES = ("drop_done", "corrupt_delta", "wrong_usage", "leak_dsml")
DSML = "｜DSML｜"


class BrokenProxy:
    def __init__(self, upstream: str, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.mode = mode
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the test output is the CLI's

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                self._forward(self.rfile.read(length))

            def _forward(self, body: bytes | None) -> None:
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                ctype = resp.getheader("content-type", "")
                conn.close()
                if resp.status == 200:
                    data = proxy.corrupt(data, ctype)
                self.send_response(resp.status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    # ---- the corruptions ---------------------------------------------------------------------

    def corrupt(self, data: bytes, ctype: str) -> bytes:
        if ctype.startswith("text/event-stream"):
            return self._stream(data.decode())
        try:
            body = json.loads(data)
        except ValueError:
            return data
        if self.mode == "wrong_usage":
            _inflate_usage(body)
        elif self.mode == "leak_dsml":
            _leak_into_body(body)
        return json.dumps(body, ensure_ascii=False).encode()

    def _stream(self, text: str) -> bytes:
        events = [e for e in text.split("\n\n") if e]
        if self.mode == "drop_done":
            events = [e for e in events if e != "data: [DONE]"]
            return "".join(e + "\n\n" for e in events).encode()
        out = []
        touched = False
        for event in events:
            head, sep, data = event.rpartition("data: ")
            try:
                payload = json.loads(data)
            except ValueError:
                out.append(event)
                continue
            if self.mode == "wrong_usage":
                _inflate_usage(payload)
            elif not touched:
                marker = "X" if self.mode == "corrupt_delta" else DSML
                touched = _append_to_delta(payload, marker)
            out.append(head + sep + json.dumps(payload, ensure_ascii=False))
        return "".join(e + "\n\n" for e in out).encode()


def _inflate_usage(value: Any) -> None:
    """+7 prompt tokens in every usage object (and nothing else)."""
    if isinstance(value, dict):
        for key in ("prompt_tokens", "input_tokens"):
            if isinstance(value.get(key), int) and (
                "completion_tokens" in value or "output_tokens" in value
            ):
                value[key] += 7
        for v in value.values():
            _inflate_usage(v)
    elif isinstance(value, list):
        for v in value:
            _inflate_usage(v)


def _append_to_delta(payload: Any, marker: str) -> bool:
    """Append marker to the first non-empty text delta in a stream event; whether it did."""
    if not isinstance(payload, dict):
        return False
    kind = payload.get("type")
    if kind is None:  # Chat: choices[].delta.content / reasoning_content
        for choice in payload.get("choices") or []:
            delta = choice.get("delta") or {}
            for key in ("content", "reasoning_content"):
                if delta.get(key):
                    delta[key] += marker
                    return True
        return False
    if kind in ("response.output_text.delta", "response.reasoning_text.delta") and payload.get(
        "delta"
    ):
        payload["delta"] += marker
        return True
    delta = payload.get("delta")
    if kind == "content_block_delta" and isinstance(delta, dict):
        for key in ("text", "thinking"):
            if delta.get(key):
                delta[key] += marker
                return True
    return False


def _leak_into_body(body: Any) -> None:
    """The marker at the end of a non-streamed answer's text (content, else reasoning)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if choices:
        msg = choices[0].get("message") or {}
        key = "content" if msg.get("content") else "reasoning_content"
        msg[key] = (msg.get(key) or "") + DSML
        return
    for item in body.get("output") or [] if isinstance(body, dict) else []:
        for part in item.get("content") or []:
            if isinstance(part.get("text"), str):
                part["text"] += DSML
                return
    for block in body.get("content") or [] if isinstance(body, dict) else []:
        for key in ("text", "thinking"):
            if isinstance(block.get(key), str):
                block[key] += DSML
                return
