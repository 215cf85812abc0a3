"""ZeroMQ sockets of the rings.

Topology (all endpoints come from config):
- the frontend binds one ROUTER; every worker connects a DEALER whose identity is its worker id
  (`prefill-0`, `decode-1`), so the frontend addresses a worker by name and sees who sent what;
- a decode worker binds a PULL for handoffs; prefill workers connect a PUSH to each decode
  worker they hand off to (the address travels in the Submit message).

High-water marks bound the queues: a worker that outruns the frontend blocks in send (back
pressure) instead of growing memory; the frontend never blocks (it sends with NOBLOCK).

Security (ipc.curve): every socket takes the process's RingSecurity, which makes tcp:// sockets
CURVE servers (bind) or clients (connect). An ipc:// socket file is created in a directory of
mode 0700 (when the directory is new) and set to mode 0600 after binding: connecting to a unix
socket needs write permission on it, so only the user running the server can join the ring.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import zmq

from deepring.ipc.codec import encode
from deepring.ipc.curve import RingSecurity
from deepring.ipc.messages import Message
from deepring.ipc.ring_keys import make_private_dirs

log = logging.getLogger("deepring.ipc")

# No keys: ipc:// as it is, tcp:// refused (see RingSecurity).
_PLAIN = RingSecurity(None)

# Messages, not bytes: a Tokens message covers a whole engine step.
RING_HWM = 1024
# Receive at most this many messages per drain, so one busy peer cannot starve the rest.
MAX_DRAIN = 512


def _ipc_path(addr: str) -> Path | None:
    return Path(addr[len("ipc://") :]) if addr.startswith("ipc://") else None


def _prepare_ipc(addr: str) -> None:
    path = _ipc_path(addr)
    if path is None:
        return
    make_private_dirs(path.parent)  # 0700 for what it creates; an existing one is left alone
    mode = stat.S_IMODE(path.parent.stat().st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        log.warning(
            "%s: the directory of this ipc:// socket is writable by others (mode %04o); "
            "another user could replace the socket",
            addr,
            mode,
        )


def _bind(s: zmq.Socket, addr: str) -> None:
    s.bind(addr)
    path = _ipc_path(addr)
    if path is not None:
        path.chmod(0o600)


def _socket(
    ctx: zmq.Context,
    kind: int,
    options: dict[int, int | bytes],
    setup: Callable[[zmq.Socket], None],
) -> zmq.Socket:
    """A socket with `options`, then `setup` (security, bind or connect); closed again when
    any of it fails (a bad endpoint, missing keys), so nothing half-made is left open."""
    s = ctx.socket(kind)
    try:
        for opt, value in options.items():
            s.setsockopt(opt, value)
        setup(s)
    except BaseException:
        s.close(linger=0)
        raise
    return s


def router(ctx: zmq.Context, addr: str, security: RingSecurity = _PLAIN) -> zmq.Socket:
    """The frontend's ring socket."""
    _prepare_ipc(addr)
    options = {
        zmq.LINGER: 0,
        zmq.ROUTER_MANDATORY: 1,  # sending to an unknown worker raises, not drops
        # A worker's routing id names its incarnation (ipc.validate), so handover only lets
        # the same process take back its own id after a reconnect.
        zmq.ROUTER_HANDOVER: 1,
        zmq.SNDHWM: RING_HWM,
        zmq.RCVHWM: RING_HWM,
    }

    def setup(s: zmq.Socket) -> None:
        security.server(ctx, s, addr)
        _bind(s, addr)

    return _socket(ctx, zmq.ROUTER, options, setup)


def dealer(
    ctx: zmq.Context, addr: str, identity: bytes, security: RingSecurity = _PLAIN
) -> zmq.Socket:
    """A worker's connection to the frontend."""
    options = {zmq.IDENTITY: identity, zmq.LINGER: 0, zmq.SNDHWM: RING_HWM, zmq.RCVHWM: RING_HWM}

    def setup(s: zmq.Socket) -> None:
        security.client(s, addr)
        s.connect(addr)

    return _socket(ctx, zmq.DEALER, options, setup)


def pull(ctx: zmq.Context, addr: str, security: RingSecurity = _PLAIN) -> zmq.Socket:
    _prepare_ipc(addr)

    def setup(s: zmq.Socket) -> None:
        security.server(ctx, s, addr)
        _bind(s, addr)

    return _socket(ctx, zmq.PULL, {zmq.LINGER: 0, zmq.RCVHWM: RING_HWM}, setup)


def push(ctx: zmq.Context, addr: str, security: RingSecurity = _PLAIN) -> zmq.Socket:
    def setup(s: zmq.Socket) -> None:
        security.client(s, addr)
        s.connect(addr)

    return _socket(ctx, zmq.PUSH, {zmq.LINGER: 0, zmq.SNDHWM: RING_HWM}, setup)


def send(sock: zmq.Socket, msg: Message, *, to: bytes | None = None, block: bool = True) -> None:
    """Send `msg` (to the peer named `to`, on a ROUTER). Large payload frames go zero-copy."""
    frames = encode(msg)
    if to is not None:
        frames.insert(0, to)
    sock.send_multipart(frames, flags=0 if block else zmq.NOBLOCK, copy=False)


def drain(sock: zmq.Socket, limit: int = MAX_DRAIN, copy: bool = True) -> Iterator[list]:
    """The messages waiting on `sock`, without blocking (at most `limit`). copy=False yields
    zmq.Frame objects (worth it for megabyte payloads only; small frames are faster copied)."""
    for _ in range(limit):
        try:
            yield sock.recv_multipart(flags=zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return


def cleanup_ipc(addr: str) -> None:
    """Remove the socket file of an ipc:// endpoint this process bound."""
    if addr.startswith("ipc://"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(addr[len("ipc://") :])
