"""The HTTP server's configurable limits, and the connection cap the open-file limit allows.

What each limit does, and what happens at it, is in http.py's docstring and
docs/architecture.md ("The HTTP server's limits").
"""

from __future__ import annotations

import resource
from dataclasses import dataclass


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int = 8 << 20
    header_timeout: float = 10.0  # the whole head, from its first byte
    body_timeout: float = 30.0  # the longest pause between two bytes of a body
    keepalive_timeout: float = 75.0  # an idle keep-alive connection (0: never closed)
    write_timeout: float = 60.0  # a client that reads nothing
    max_connections: int = 1024

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "write_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.keepalive_timeout < 0:
            raise ValueError("keepalive_timeout must be >= 0")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")


def default_max_connections() -> int:
    """1024, or what the open-file limit leaves room for: 128 descriptors for everything else
    (ring sockets, pipes, logs) and an eighth more for connections being turned away."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, int((soft - 128) / 1.125)))


def fd_budget(max_connections: int) -> int:
    """File descriptors `max_connections` may need (see default_max_connections)."""
    return int(max_connections * 1.125) + 128
