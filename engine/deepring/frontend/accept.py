"""Accepting connections on asyncio's own (selector) event loop, with a real back-off when the
process is out of file descriptors.

Why: on EMFILE, CPython's selector loop (3.11) logs, removes its accept handler and schedules a
retry, and then goes on calling accept() up to `backlog` times in the same turn, scheduling a
retry (and logging) for each; the retries pile up and the loop spins at full speed writing
tracebacks. uvloop does not (libuv sheds the connection), so `deepring serve`, which runs on
uvloop, keeps the loop's own accepting; on any other loop the server hands its listening sockets
to an Acceptor: one warning, no accepting for ACCEPT_PAUSE, then again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable

log = logging.getLogger("deepring.http")

ACCEPT_PAUSE = 0.5  # seconds without accept() after the process ran out of descriptors
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def loop_sheds_emfile(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the loop's own accepting survives EMFILE without spinning (uvloop's does)."""
    return type(loop).__module__.startswith("uvloop")


class Acceptor:
    """Accepts on dups of a server's listening sockets (the server keeps its own, unread)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fds: list[int],
        protocol: Callable[[], asyncio.Protocol],
    ) -> None:
        self.loop = loop
        self.protocol = protocol
        self.socks = [socket.socket(fileno=os.dup(fd)) for fd in fds]
        for fd, sock in zip(fds, self.socks, strict=True):
            sock.setblocking(False)
            loop.remove_reader(fd)  # the loop's own accept handler
            loop.add_reader(sock.fileno(), self._accept, sock)
        self._warned_at = float("-inf")

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(64):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    log.error("accept() failed: %s", e)
                    return
                now = self.loop.time()
                if now - self._warned_at > 60:  # a line a minute, not one per retry
                    self._warned_at = now
                    log.warning(
                        "accept() failed (%s); pausing accepting for %.1fs", e, ACCEPT_PAUSE
                    )
                self.loop.remove_reader(sock.fileno())
                self.loop.call_later(ACCEPT_PAUSE, self._resume, sock)
                return
            conn.setblocking(False)
            self.loop.create_task(self._connect(conn))

    def _resume(self, sock: socket.socket) -> None:
        if sock.fileno() >= 0:
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.protocol, conn)
        except OSError:
            conn.close()

    def close(self) -> None:
        for sock in self.socks:
            if sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())
                sock.close()
