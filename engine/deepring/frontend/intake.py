"""What the frontend takes from its ring socket, and what it drops.

Every frame set on the ROUTER passes here before the ring client acts on it. A message is
taken only when it decodes (ipc.codec), is a type workers send (Tokens, Health, Stats), comes
from a routing id of the form `<role>-<index>/<gen>` (ipc.validate) whose names agree with the
message's own, and makes sense (a `ready`'s facts, a load report's counts, a Tokens message's
lists). Tokens and Stats are taken only from the registered incarnation of a worker: the same
worker name from another routing id (another process, or a stale one) is not that worker.

Anything else is dropped, counted in deepring_ring_dropped_frames_total{reason} and logged at
most once per reason per interval, with printable identities only (ipc.drops). Nothing a peer
sends can raise out of here.
"""

from __future__ import annotations

import logging

from deepring.frontend.metrics import Metrics
from deepring.ipc import drops
from deepring.ipc.codec import MessageError, decode_strict
from deepring.ipc.messages import Health, Message, Stats, Tokens
from deepring.ipc.validate import (
    health_problem,
    parse_route,
    ready_problem,
    stats_problem,
    tokens_problem,
)
from deepring.routing.registry import WorkerRegistry, WorkerState

log = logging.getLogger("deepring.frontend")

_FROM_WORKERS = (Tokens, Health, Stats)


class RingIntake:
    def __init__(self, registry: WorkerRegistry, metrics: Metrics) -> None:
        self.registry = registry
        self.drops = drops.DropLog(log, "frontend", metrics.ring_dropped)

    def accept(self, frames: list) -> tuple[bytes, str, Message] | None:
        """(routing id, worker id, message) of a frame set the ring client may act on; None
        when it was dropped."""
        if len(frames) < 2:
            peer = bytes(frames[0]) if frames else b""
            self.drops.drop(drops.MALFORMED, peer, "no message after the routing id")
            return None
        route = bytes(frames[0])
        try:
            msg = decode_strict(frames[1:])
        except MessageError as e:
            self.drops.drop(drops.MALFORMED, route, str(e))
            return None
        if not isinstance(msg, _FROM_WORKERS):
            self.drops.drop(drops.UNEXPECTED, route, f"a {msg.TYPE} message from a worker")
            return None
        parsed = parse_route(route)
        if parsed is None:
            self.drops.drop(drops.BAD_IDENTITY, route, "routing id is not <role>-<index>/<gen>")
            return None
        wid = parsed[0]
        if isinstance(msg, Health):
            if msg.state == "ready":
                problem, reason = ready_problem(route, msg), drops.BAD_REGISTRATION
            else:
                problem, reason = health_problem(route, msg), drops.BAD_IDENTITY
            if problem is not None:
                self.drops.drop(reason, route, problem)
                return None
            return route, wid, msg
        w = self.registry.workers.get(wid)
        if w is None or w.route != route:
            self.drops.drop(
                drops.UNKNOWN_PEER, route, f"a {msg.TYPE} message from no registered worker"
            )
            return None
        if isinstance(msg, Stats):
            problem, reason = _stats(msg, w), drops.BAD_STATS
        else:
            problem, reason = _tokens(msg, w), drops.BAD_TOKENS
        if problem is not None:
            self.drops.drop(reason, route, problem)
            return None
        return route, wid, msg

    def refuse_takeover(self, route: bytes, old: WorkerState, msg: Health) -> None:
        """A `ready` for a worker id that a live registered process holds: refused."""
        self.drops.drop(
            drops.IDENTITY_IN_USE,
            route,
            f"{old.id} is registered to pid {old.pid}, which is alive; pid {msg.pid} may "
            "register under that id once it is declared dead (exit, shutdown or missed "
            "heartbeats)",
        )


def _stats(msg: Stats, w: WorkerState) -> str | None:
    if msg.worker != w.id or msg.gen != w.gen:
        return f"a load report names {msg.worker!r:.40}, not {w.id}"
    return stats_problem(msg)


def _tokens(msg: Tokens, w: WorkerState) -> str | None:
    if msg.worker != w.id:
        return f"tokens name {msg.worker!r:.40}, not {w.id}"
    return tokens_problem(msg, w.info.get("vocab_size"))
