"""The image fetcher against a 127.0.0.1 server, side by side with the official's: status codes,
content types, size limits (with and without Content-Length), redirects, destination filters
(refused hosts, redirects to refused hosts, filters that raise or return non-booleans). The
Python resolver always has a fetcher (the official's signature); the Rust resolver without one
never fetches (crates/image/src/resolve.rs). The timeout, which Python cannot set, and the
public-address filter are tested in Rust (crates/image/tests/fetch.rs). HTTPS: a 127.0.0.1 TLS
server whose certificate no root vouches for is refused alike."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import deepring_recipe as ours
import deepseek_recipe as official
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from images_support import PNG_30x20, _Handler, outcome, server

LIBS = (ours, official)


def _fetch(fetcher, url: str):
    return outcome(lambda: len(fetcher.fetch(url)))


def _alike(make, url_of):
    """Runs `fetch` with the fetcher `make(lib)` builds on both libraries; the outcomes, with the
    server's port written as PORT, must be equal."""
    with server() as base:
        port = base.rsplit(":", 1)[1]
        url = url_of(base)
        got, want = (_fetch(make(lib), url) for lib in LIBS)
    assert got == want, (got, want)
    return str(got).replace(port, "PORT")


@pytest.mark.parametrize(
    "path",
    [
        "/png",
        "/png?ct=text/html",
        "/png?ct=application/octet-stream",
        "/status/404",
        "/status/403",
        "/status/500",
        "/status/503",
        "/status/429",
        "/nowhere",
    ],
)
def test_plain_fetches_alike(path):
    _alike(lambda lib: lib.ReqwestImageFetcher(), lambda base: base + path)


@pytest.mark.parametrize("path", ["/big/5000", "/stream/5000", "/big/100", "/stream/100"])
def test_size_limit_alike(path):
    _alike(lambda lib: lib.ReqwestImageFetcher.with_max_bytes(1000), lambda base: base + path)


def test_size_limit_in_megabytes_alike():
    got = _alike(
        lambda lib: lib.ReqwestImageFetcher.with_max_bytes(3 * 1024 * 1024),
        lambda base: base + "/big/4000000",
    )
    assert "ImageTooLarge" in got


def test_redirects_alike():
    _alike(lambda lib: lib.ReqwestImageFetcher(), lambda base: f"{base}/redirect?to={base}/png")
    _alike(
        lambda lib: lib.ReqwestImageFetcher(),
        lambda base: f"{base}/redirect?to=ftp://example.invalid/x.png",
    )


def _only_literal_loopback(host: str, addr: str) -> bool:
    return host == "127.0.0.1"


def test_filter_refuses_names_and_redirects_to_them():
    make = lambda lib: lib.ReqwestImageFetcher().with_destination_filter(_only_literal_loopback)  # noqa: E731
    assert _alike(make, lambda base: base + "/png") == f"('ok', {len(PNG_30x20)})"
    got = _alike(make, lambda base: base.replace("127.0.0.1", "localhost") + "/png")
    assert "DestinationRejected" in got
    got = _alike(
        make, lambda base: f"{base}/redirect?to={base.replace('127.0.0.1', 'localhost')}/png"
    )
    assert "DestinationRejected" in got


def test_filter_sees_host_and_each_address():
    calls: dict = {ours: [], official: []}
    with server() as base:
        url = base.replace("127.0.0.1", "localhost") + "/png"
        for lib in LIBS:
            f = lib.ReqwestImageFetcher().with_destination_filter(
                lambda h, a, lib=lib: calls[lib].append((h, a)) or True
            )
            assert len(f.fetch(url)) == len(PNG_30x20)
    assert calls[ours]
    assert {c[0] for c in calls[ours]} == {"localhost"}
    assert set(calls[ours]) <= {("localhost", "127.0.0.1"), ("localhost", "::1")}
    assert {c[1] for c in calls[official]} <= {c[1] for c in calls[ours]} | {"127.0.0.1"}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    "verdict", [lambda h, a: 1, lambda h, a: None, lambda h, a: 1 / 0, lambda h, a: "yes"]
)
def test_filters_that_misbehave_refuse(verdict):
    got = _alike(
        lambda lib: lib.ReqwestImageFetcher().with_destination_filter(verdict),
        lambda base: base + "/png",
    )
    assert "DestinationRejected" in got


def test_resolver_reports_fetch_failures_alike():
    for path in ("/status/404", "/status/503", "/big/5000", "/png"):
        with server() as base:
            got, want = (
                outcome(
                    lambda lib=lib, path=path: [
                        (i.width, i.height)
                        for i in lib.ImageResolver(
                            lib.ReqwestImageFetcher.with_max_bytes(1000),
                            lib.OpenCvImagePreprocessor(),
                        )
                        .resolve(
                            [lib.UrlImageSource(base + path, path="messages.0.content[2]")],
                            lib.ImageQuota(),
                        )
                        .images
                    ]
                )
                for lib in LIBS
            )
        assert got == want


def test_links_over_8192_bytes_are_refused_alike():
    """A link longer than 8192 bytes of UTF-8 is refused before it is fetched (kind UrlTooLong,
    not retryable, the official's message without a location), in order with the other
    sources' checks; one of exactly 8192 bytes is fetched."""
    with server() as base:
        page = base + "/status/404?"  # (a fetched link gets a 404: a failed download)
        long = page + "a" * 9000
        cases = [
            [page + "a" * (8192 - len(page))],
            [page + "a" * (8193 - len(page))],
            [page + "é" * 4100],
            [long, "ftp://x"],
            ["ftp://x", long],
            [long] * 2,
        ]
        for urls in cases:
            got, want = (
                outcome(
                    lambda lib=lib, urls=urls: len(
                        lib.ImageResolver(lib.ReqwestImageFetcher(), lib.OpenCvImagePreprocessor())
                        .resolve([lib.UrlImageSource(u) for u in urls], lib.ImageQuota())
                        .images
                    )
                )
                for lib in LIBS
            )
            assert got == want, [len(u.encode()) for u in urls]
        assert got[1] == "UrlTooLong"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_with_an_untrusted_certificate_is_refused_alike(tmp_path):
    """A self-signed certificate for 127.0.0.1: the server answers TLS (a client that trusts
    the certificate gets the image), and both fetchers refuse it the same way."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{srv.server_address[1]}/png"
        trusting = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(url, context=trusting, timeout=30) as r:
            assert r.read() == PNG_30x20
        got, want = (_fetch(lib.ReqwestImageFetcher(), url) for lib in LIBS)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
    assert got == want, (got, want)
    assert got[:2] == ("ImageError", "Fetch"), got
