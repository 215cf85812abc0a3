"""Starting and probing a real `deepring serve` (or one role) in a subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2

READY = re.compile(r"deepring: ready on (http://\S+)")


def deepring_command() -> list[str]:
    exe = Path(sys.executable).with_name("deepring")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "deepring.cli"]


class Server:
    """`deepring serve --port 0 ...` with its output in a log file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [*deepring_command(), "serve", "--port", "0", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C of the test run does not reach it directly
        )
        self.url = self._wait_ready()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_ready(self, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = READY.search(self.log())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop(signal.SIGKILL)
        raise AssertionError(f"deepring serve did not become ready:\n{self.log()[-4000:]}")

    def health(self) -> dict:
        return httpx2.get(f"{self.url}/health", timeout=10).json()

    def worker_pid(self, role: str) -> int:
        return next(w["pid"] for w in self.health()["workers"] if w["role"] == role)

    def wait_healthy(self, timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if h["status"] == "ok":
                return h
            time.sleep(0.1)
        raise AssertionError(f"server did not recover: {json.dumps(self.health())}")

    def metric(
        self, name: str, labels: str = "", default: float | None = None, headers=None
    ) -> float:
        text = httpx2.get(f"{self.url}/metrics", headers=headers, timeout=10).text
        for line in text.splitlines():
            if line.startswith(f"{name}{labels} "):
                return float(line.rsplit(" ", 1)[1])
        if default is not None:
            return default
        raise KeyError(f"{name}{labels}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(10)
        self._log.close()
        return code


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for ring and handoff endpoints)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RoleProcess:
    """One `deepring <command>` (frontend, prefill, decode) with its output in a log file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [*deepring_command(), *args], stdout=self._log, stderr=subprocess.STDOUT, env=env
        )

    def url(self, timeout: float = 240) -> str:
        """The HTTP URL a frontend prints once it is ready."""
        deadline = time.monotonic() + timeout
        while not (m := READY.search(self.log_path.read_text(errors="replace"))):
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, self.log_path.read_text()[-3000:]
            time.sleep(0.1)
        return m.group(1)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(60)
        self._log.close()
        return code
