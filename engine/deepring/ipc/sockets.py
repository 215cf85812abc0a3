"""ZeroMQ sockets of the rings.

Topology (all endpoints come from config):
- the frontend binds one ROUTER; every worker connects a DEALER whose identity is its worker id
  (`prefill-0`, `decode-1`), so the frontend addresses a worker by name and sees who sent what;
- a decode worker binds a PULL for handoffs; prefill workers connect a PUSH to each decode
  worker they hand off to (the address travels in the Submit message).

High-water marks bound the queues: a worker that outruns the frontend blocks in send (back
pressure) instead of growing memory; the frontend never blocks (it sends with NOBLOCK).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import zmq

from deepring.ipc.codec import encode
from deepring.ipc.messages import Message

# Messages, not bytes: a Tokens message covers a whole engine step.
RING_HWM = 1024
# Receive at most this many messages per drain, so one busy peer cannot starve the rest.
MAX_DRAIN = 512


def _prepare_ipc(addr: str) -> None:
    if addr.startswith("ipc://"):
        path = Path(addr[len("ipc://") :])
        path.parent.mkdir(parents=True, exist_ok=True)


def router(ctx: zmq.Context, addr: str) -> zmq.Socket:
    """The frontend's ring socket."""
    _prepare_ipc(addr)
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to an unknown worker raises, not drops
    s.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted worker takes over its identity
    s.setsockopt(zmq.SNDHWM, RING_HWM)
    s.setsockopt(zmq.RCVHWM, RING_HWM)
    s.bind(addr)
    return s


def dealer(ctx: zmq.Context, addr: str, identity: str) -> zmq.Socket:
    """A worker's connection to the frontend."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity.encode())
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, RING_HWM)
    s.setsockopt(zmq.RCVHWM, RING_HWM)
    s.connect(addr)
    return s


def pull(ctx: zmq.Context, addr: str) -> zmq.Socket:
    _prepare_ipc(addr)
    s = ctx.socket(zmq.PULL)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, RING_HWM)
    s.bind(addr)
    return s


def push(ctx: zmq.Context, addr: str) -> zmq.Socket:
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, RING_HWM)
    s.connect(addr)
    return s


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
