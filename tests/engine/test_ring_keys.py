"""The ring's CURVE keys and sockets, without workers: the key directory (private modes, race-
free creation, refusal of keys others can read, what each role needs), tcp:// sockets that
admit only the configured client keys, and ipc:// sockets only their owner can reach."""

from __future__ import annotations

import contextlib
import os
import stat
import threading

import pytest
import zmq
import zmq.auth
from deepring import cli
from deepring.config import EngineSpec, FrontendConfig, WorkerConfig
from deepring.ipc import curve, ring_keys, sockets
from deepring.ipc.curve import RingSecurity
from deepring.ipc.ring_keys import RingKeyError

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_generate_makes_a_private_directory_of_certificates(tmp_path):
    d = tmp_path / "keys"
    assert ring_keys.generate(d)
    assert not ring_keys.generate(d)  # there already
    assert _mode(d) == 0o700
    for name in ("server.key", "server.key_secret", "client.key", "client.key_secret"):
        assert _mode(d / name) == 0o600
    keys = ring_keys.load(d)
    assert zmq.curve_public(keys.server_secret) == keys.server_public
    assert zmq.curve_public(keys.client_secret) == keys.client_public
    assert keys.authorized == {keys.client_public}
    assert keys.server_secret.decode() not in repr(keys)
    assert keys.client_secret.decode() not in repr(keys)
    # ZeroMQ's own certificate reader reads them.
    assert zmq.auth.load_certificate(d / "server.key_secret") == (
        keys.server_public,
        keys.server_secret,
    )


def test_concurrent_first_starts_share_one_set_of_keys(tmp_path):
    d = tmp_path / "keys"
    created = []

    def go() -> None:
        created.append(ring_keys.generate(d))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert created.count(True) == 1
    ring_keys.load(d)
    assert [p.name for p in tmp_path.iterdir()] == ["keys"]  # no temporary directory left


def test_keys_others_can_read_are_refused(tmp_path):
    d = tmp_path / "keys"
    ring_keys.generate(d)
    (d / "client.key_secret").chmod(0o640)
    with pytest.raises(RingKeyError, match=r"readable by group or others.*chmod 600"):
        ring_keys.load(d)
    (d / "client.key_secret").chmod(0o600)
    d.chmod(0o770)
    with pytest.raises(RingKeyError, match=r"writable by group or others.*chmod 700"):
        ring_keys.load(d)


def test_damaged_and_mismatched_certificates_are_refused(tmp_path):
    d = tmp_path / "keys"
    ring_keys.generate(d)
    text = (d / "server.key_secret").read_text()
    (d / "server.key_secret").write_text(text.replace('secret-key = "', 'secret-key = "x'))
    with pytest.raises(RingKeyError, match="not a ZeroMQ CURVE certificate"):
        ring_keys.load(d)
    other = tmp_path / "other"
    ring_keys.generate(other)
    (d / "server.key_secret").write_text((other / "server.key_secret").read_text())
    with pytest.raises(RingKeyError, match="do not match"):
        ring_keys.load(d)


def test_each_role_needs_its_own_keys(tmp_path):
    d = tmp_path / "keys"
    with pytest.raises(RingKeyError, match="no ring keys in"):
        ring_keys.load(d)
    ring_keys.generate(d)
    # A prefill-only host: no servers' secret.
    (d / "server.key_secret").unlink()
    keys = ring_keys.load(d)
    keys.need(client=True)
    with pytest.raises(RingKeyError, match="servers' secret key"):
        keys.need(server=True)
    (d / "client.key_secret").unlink()
    with pytest.raises(RingKeyError, match="clients' keypair"):
        ring_keys.load(d).need(client=True)


def test_tcp_rings_need_keys_or_an_explicit_insecure_ring():
    with pytest.raises(ValueError, match="CURVE keys"):
        FrontendConfig(ring_addr="tcp://127.0.0.1:5555")
    FrontendConfig(ring_addr="tcp://127.0.0.1:5555", insecure_ring=True)
    with pytest.raises(ValueError, match="CURVE keys"):
        WorkerConfig(
            role="decode",
            index=0,
            frontend_addrs=("ipc:///tmp/x/ring",),
            handoff_bind="tcp://127.0.0.1:5601",
            engine=EngineSpec(),
        )


def test_role_commands_without_keys_and_libzmq_without_curve_are_refused(
    capsys, tmp_path, monkeypatch
):
    keys = str(tmp_path / "keys")
    assert cli.main(["prefill", "--frontend", "tcp://127.0.0.1:1", "--ring-keys", keys]) == 2
    assert "no ring keys in" in capsys.readouterr().err
    monkeypatch.setattr(curve, "curve_available", lambda: False)
    argv = ["frontend", "--ring", "tcp://127.0.0.1:1", "--ring-keys", keys]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "no CURVE support" in err
    assert "--insecure-ring" in err


def test_ring_keys_command_creates_and_shows_public_keys_only(capsys, tmp_path):
    d = tmp_path / "keys"
    assert cli.main(["ring-keys", "--ring-keys", str(d)]) == 0
    out = capsys.readouterr().out
    keys = ring_keys.load(d)
    assert f"created ring keys in {d}" in out
    assert keys.server_public.decode() in out
    assert keys.server_secret.decode() not in out
    assert keys.client_secret.decode() not in out
    assert cli.main(["ring-keys", "--ring-keys", str(d)]) == 0
    assert "existing ring keys" in capsys.readouterr().out


def _recv(sock: zmq.Socket, timeout_ms: int = 1500):
    return sock.recv_multipart() if sock.poll(timeout_ms) else None


def test_a_curve_server_admits_only_authorized_client_keys(tmp_path):
    d = tmp_path / "keys"
    ring_keys.generate(d)
    extra_pub, extra_sec = zmq.curve_keypair()
    cert = f'curve\n    public-key = "{extra_pub.decode()}"\n'
    (d / "authorized" / "host-b.key").write_text(cert)
    security = RingSecurity.load(str(d), insecure=False)
    keys = security.keys
    ctx = zmq.Context()
    try:
        server = ctx.socket(zmq.ROUTER)
        server.linger = 0
        security.server(ctx, server, "tcp://127.0.0.1:0")
        addr = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"

        clients = []  # kept: a socket collected unclosed is a ResourceWarning

        def client(public=None, secret=None) -> None:
            s = ctx.socket(zmq.DEALER)
            clients.append(s)
            s.linger = 0
            if public is not None:
                s.curve_serverkey = keys.server_public
                s.curve_publickey, s.curve_secretkey = public, secret
            s.connect(addr)
            # Not blocking: a refused handshake can drop the socket's only pipe before the send
            # (a DEALER with no pipe blocks for ever); the message is then not queued, and the
            # server's receive, the assertion, tells admitted from refused either way.
            with contextlib.suppress(zmq.Again):
                s.send(b"hello", zmq.DONTWAIT)

        client()  # no CURVE at all
        assert _recv(server) is None
        client(*zmq.curve_keypair())  # a key the directory does not name
        assert _recv(server) is None
        assert security.denied == 1
        client(keys.client_public, keys.client_secret)
        assert _recv(server)[1] == b"hello"
        client(extra_pub, extra_sec)  # authorized/host-b.key
        assert _recv(server)[1] == b"hello"
        # The workers' socket helper is a client of it.
        clients.append(sockets.dealer(ctx, addr, b"prefill-0/1", security))
        clients[-1].send(b"from a worker")
        assert _recv(server) == [b"prefill-0/1", b"from a worker"]
    finally:
        security.close()
        ctx.destroy(linger=0)


def test_a_curve_server_without_its_zap_handler_admits_no_one(tmp_path):
    d = tmp_path / "keys"
    ring_keys.generate(d)
    keys = ring_keys.load(d)
    ctx = zmq.Context()
    try:
        server = ctx.socket(zmq.ROUTER)
        server.linger = 0
        server.curve_secretkey = keys.server_secret
        server.curve_server = True
        server.zap_domain = curve.ZAP_DOMAIN.encode()
        server.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        port = server.bind_to_random_port("tcp://127.0.0.1")
        c = ctx.socket(zmq.DEALER)
        c.linger = 0
        c.curve_serverkey = keys.server_public
        c.curve_publickey, c.curve_secretkey = keys.client_public, keys.client_secret
        c.connect(f"tcp://127.0.0.1:{port}")
        c.send(b"hello")
        assert _recv(server) is None
    finally:
        ctx.destroy(linger=0)


def test_ipc_sockets_are_private_to_their_user(tmp_path):
    ctx = zmq.Context()
    try:
        addr = f"ipc://{tmp_path}/new/dir/ring"
        sock = sockets.router(ctx, addr)
        assert _mode(tmp_path / "new" / "dir") == 0o700
        assert _mode(tmp_path / "new") == 0o700
        assert _mode(tmp_path / "new" / "dir" / "ring") == 0o600
        sock.close()
        with pytest.raises(RingKeyError, match="no ring keys"):
            sockets.router(ctx, "tcp://127.0.0.1:0")
    finally:
        ctx.destroy(linger=0)
