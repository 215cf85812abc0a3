"""Shared pieces of the prefix KV cache store tests (test_kv_store*.py)."""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


class FakeClock:
    """A store clock the test moves by hand: TTLs and backoffs without sleeping."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def key(i: int | str) -> bytes:
    """A 32-byte key, as the engine's hash chain makes them."""
    return hashlib.sha256(str(i).encode()).digest()


def value(i: int, size: int = 1000) -> bytes:
    """A value of `size` bytes that differs for each i."""
    seed = hashlib.sha256(f"value {i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class RedisServer:
    """A redis-server of the test's own on a free loopback port, persisting nothing, in a
    temporary directory. The binary comes from the system (`./dev` installs it); without it
    the test fails, naming it, rather than skipping, so that CI cannot lose these tests."""

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail(
                "redis-server is not on PATH: the Redis store tests start their own server."
                " Install it (./dev setup does, as root with apt-get; or apt-get install"
                " redis-server / brew install redis)",
                pytrace=False,
            )
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        log = (self.workdir / "redis.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                output = (self.workdir / "redis.log").read_text(errors="replace")
                pytest.fail(f"redis-server exited with {self.proc.returncode}:\n{output}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"redis-server did not answer on port {self.port} in {timeout_s} s")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
