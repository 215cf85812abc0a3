"""Who may talk on the rings: ZeroMQ CURVE on every tcp:// ring socket.

On tcp:// the binding sockets (the frontend's ROUTER, each decode worker's handoff PULL) are
CURVE servers and the connecting ones (workers' DEALERs, prefill workers' handoff PUSHes) CURVE
clients, with the keys of one key directory (ipc.ring_keys). CURVE encrypts and authenticates
every connection; on top of it a ZAP handler (pyzmq's ThreadAuthenticator, one thread per
process that binds a server socket) admits only the client public keys of the key directory.
A peer without them gets no connection at all: nothing it sends reaches the process. Server
sockets also set ZAP_ENFORCE_DOMAIN, so a server whose ZAP handler is missing refuses every
client instead of admitting all of them.

ipc:// sockets are not encrypted: they never leave the machine, and ipc.sockets creates their
directory with mode 0700 and their socket files with mode 0600, so only the user running the
server can connect. `insecure=True` (`--insecure-ring`) runs tcp:// without CURVE, for a
private network you trust or a libzmq built without CURVE.
"""

from __future__ import annotations

import logging
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from deepring.ipc import ring_keys
from deepring.ipc.ring_keys import RingKeyError, RingKeys

log = logging.getLogger("deepring.ipc")

ZAP_DOMAIN = "deepring"


def needs_curve(addr: str) -> bool:
    return addr.startswith("tcp://")


def curve_available() -> bool:
    return bool(zmq.has("curve"))


class _Admit:
    """The ZAP decision: a CURVE client is admitted when its public key is configured."""

    def __init__(self, authorized: frozenset[bytes]) -> None:
        self.authorized = authorized
        self.denied = 0  # handshakes refused (read by /metrics; an int bump is atomic enough)

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key in self.authorized
        if not ok:
            self.denied += 1
        return ok


class RingSecurity:
    """How one process secures its ring sockets. `keys` None: no CURVE (ipc:// only, or
    `insecure`). A tcp:// socket without keys is refused unless `insecure` is set."""

    def __init__(self, keys: RingKeys | None, insecure: bool = False) -> None:
        self.keys = keys
        self.insecure = insecure
        self._auth: ThreadAuthenticator | None = None
        self._admit: _Admit | None = None

    @classmethod
    def load(cls, directory: str | None, insecure: bool) -> RingSecurity:
        """The security of a process configured with key directory `directory` (None: none)."""
        if insecure or directory is None:
            return cls(None, insecure)
        if not curve_available():
            raise RingKeyError("this libzmq has no CURVE support; use --insecure-ring")
        return cls(ring_keys.load(Path(directory)), False)

    @property
    def denied(self) -> int:
        """CURVE handshakes refused because the client's key is not authorized."""
        return self._admit.denied if self._admit is not None else 0

    def _keys_for(self, addr: str) -> RingKeys | None:
        """The keys a socket on `addr` uses; None: none (ipc://, or tcp:// with
        --insecure-ring)."""
        if not needs_curve(addr) or (self.keys is None and self.insecure):
            return None
        if self.keys is not None:
            return self.keys
        raise RingKeyError(
            f"{addr} is a tcp:// endpoint and no ring keys are configured (--ring-keys DIR, "
            "or --insecure-ring on a trusted network)"
        )

    def server(self, ctx: zmq.Context, sock: zmq.Socket, addr: str) -> None:
        """Make `sock`, about to bind `addr`, a CURVE server admitting only authorized keys."""
        keys = self._keys_for(addr)
        if keys is None:
            return
        keys.need(server=True)
        if self._auth is None:
            self._admit = _Admit(keys.authorized)
            auth = ThreadAuthenticator(ctx, log=logging.getLogger("deepring.ipc.zap"))
            auth.start()
            auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self._admit)
            self._auth = auth
        sock.curve_secretkey = keys.server_secret
        sock.curve_publickey = keys.server_public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN.encode()
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)

    def client(self, sock: zmq.Socket, addr: str) -> None:
        """Make `sock`, about to connect to `addr`, a CURVE client of the ring's servers."""
        keys = self._keys_for(addr)
        if keys is None:
            return
        keys.need(client=True)
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.client_public
        sock.curve_secretkey = keys.client_secret

    def close(self) -> None:
        """Stop the ZAP thread (before the context is destroyed: it owns a socket there)."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
