"""Which web pages may call the API: the Origin rule behind 403 for cross-site requests.

A browser names the page that makes a request in its Origin header (on every cross-site
request, and on same-site ones other than GET and HEAD); the official SDKs, curl and servers
send none. A page of another site can make a browser POST to this server (a "simple" request
needs no CORS preflight when its Content-Type is text/plain or a form type, and the app refuses
those with 415), and the server would otherwise run it. So a request whose Origin names another
host or port than the Host it was sent to is refused with 403, unless `--allowed-origins` lists
that origin (or `*`). Allowed cross-origin requests get the CORS fields a browser needs to read
the answer, and preflights (OPTIONS) are answered for them.

Same host: the hosts match (case-insensitively) and so do the ports, the Origin's port being its
scheme's default when it names none. A Host without a port matches an Origin on either default
port, 80 or 443, so a server behind a TLS-terminating proxy is same-site with its https pages.
"""

from __future__ import annotations

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _split(hostport: str) -> tuple[str, int | None] | None:
    """host[:port] (or [v6]:port) -> (lower-case host, port or None); None when malformed."""
    hostport = hostport.strip().lower()
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return None
        host, rest = hostport[: end + 1], hostport[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    else:
        host, _, port = hostport.partition(":")
    if not host:
        return None
    if not port:
        return host, None
    if not port.isdigit() or len(port) > 5:
        return None
    return host, int(port)


def same_host(origin: str, host: str | None) -> bool:
    """Whether a browser's Origin names the host (and port) the request was sent to."""
    scheme, sep, rest = origin.strip().partition("://")
    default = _DEFAULT_PORTS.get(scheme.lower())
    if not sep or default is None or host is None:
        return False  # "null" (a sandboxed or file: page), another scheme, or no Host
    o = _split(rest.rstrip("/"))
    h = _split(host)
    if o is None or h is None or o[0] != h[0]:
        return False
    o_port = o[1] if o[1] is not None else default
    return o_port in (80, 443) if h[1] is None else o_port == h[1]


def normalize(origins: tuple[str, ...]) -> frozenset[str]:
    """--allowed-origins as origin_allowed compares them."""
    return frozenset(o.strip().rstrip("/").lower() for o in origins)


def origin_allowed(origin: str, allowed: frozenset[str]) -> bool:
    """Whether `allowed` (normalized) lists a cross-site origin; "*" allows any."""
    return "*" in allowed or origin.strip().rstrip("/").lower() in allowed


def cors_headers(origin: str) -> list[tuple[str, str]]:
    """The fields that let a page of `origin` read the answer to an allowed request."""
    return [("access-control-allow-origin", origin), ("vary", "origin")]


def preflight_headers(origin: str, request_headers: str) -> list[tuple[str, str]]:
    """The answer to an allowed CORS preflight (OPTIONS with Access-Control-Request-Method)."""
    return [
        *cors_headers(origin),
        ("access-control-allow-methods", "GET, HEAD, POST"),
        ("access-control-allow-headers", request_headers or "content-type"),
        ("access-control-max-age", "600"),
    ]
