"""Helpers of the image tests: encoded test images, outcomes comparable across libraries, and a
127.0.0.1 HTTP server with the behaviours the fetcher tests need."""

from __future__ import annotations

import contextlib
import http.server
import io
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from PIL import Image

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


def solid(w: int, h: int, fmt: str = "PNG", color: tuple[int, int, int] = (200, 40, 90)) -> bytes:
    """A one-colour image: cheap at any size, and resampled to the same colour by any filter."""
    mode = "P" if fmt == "GIF" else "RGB"
    im = Image.new("RGB", (w, h), color)
    if mode == "P":
        # An adaptive palette holds the colour exactly (the default web palette dithers).
        im = im.convert("P", palette=Image.Palette.ADAPTIVE)
    # Lossless WebP: a lossy one-colour WebP a pixel or two wide decodes to several colours.
    options = {"PNG": {"compress_level": 1}, "WEBP": {"lossless": True}}.get(fmt, {})
    out = io.BytesIO()
    im.save(out, fmt, **options)
    return out.getvalue()


def photo(w: int, h: int, fmt: str = "PNG", seed: int = 0) -> bytes:
    """A photo-like image: smooth gradients, a few hard edges and mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 128 + 90 * np.sin(x / (w / 3 + 1)) * np.cos(y / (h / 2 + 1))
    g = 128 + 80 * np.cos((x + y) / (w / 5 + 1))
    b = 100 + 60 * ((x // max(1, w // 6) + y // max(1, h // 4)) % 2)
    a = np.stack([r, g, b], -1) + rng.normal(0, 6, (h, w, 3))
    out = io.BytesIO()
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(
        out, fmt, **({"quality": 90} if fmt == "JPEG" else {})
    )
    return out.getvalue()


def pixels(webp: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(webp)).convert("RGB")).astype(np.int16)


def outcome(f: Callable[[], Any]) -> tuple:
    """What a call did, comparable across the two libraries: ("ok", value) or the exception's
    type name, `kind`, `is_retryable` and message."""
    try:
        return ("ok", f())
    except Exception as e:  # noqa: BLE001 - the exception is the result under test
        return (
            type(e).__name__,
            getattr(e, "kind", None),
            getattr(e, "is_retryable", None),
            str(e),
        )


PNG_30x20 = solid(30, 20)


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /png[?ct=TYPE], /status/N, /redirect?to=URL, /big/N (with Content-Length),
    /stream/N (no length), /slow (headers, then a stall)."""

    def log_message(self, *args: object) -> None:
        pass

    def _body(self, data: bytes, ctype: str = "image/png", length: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        if length:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        # The client may hang up once it has read past its size limit.
        with contextlib.suppress(OSError):
            self.wfile.write(data)

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/png":
            self._body(PNG_30x20, query.removeprefix("ct=") or "image/png")
        elif path.startswith("/status/"):
            self.send_response(int(path.rsplit("/", 1)[1]))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/redirect":
            self.send_response(302)
            self.send_header("Location", query.removeprefix("to="))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path.startswith("/big/"):
            self._body(PNG_30x20[:8] + b"\0" * int(path.rsplit("/", 1)[1]))
        elif path.startswith("/stream/"):
            self.close_connection = True
            self._body(PNG_30x20[:8] + b"\0" * int(path.rsplit("/", 1)[1]), length=False)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()


@contextmanager
def server() -> Iterator[str]:
    """A local server for one test; yields its base URL (http://127.0.0.1:PORT)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
