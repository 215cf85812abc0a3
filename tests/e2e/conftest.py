"""End-to-end fixtures: a real `deepring serve` in a subprocess on a free port.

Every test here drives the server through the official `openai` and `anthropic` SDKs (or raw
HTTP where the wire format itself is under test). They need deepring_recipe's streaming API
(stream processor, chunk generators, responses); without it they are skipped, and say so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import deepring_recipe
import httpx2
import pytest
from deepring.frontend.protocols import missing_api

MISSING = missing_api(deepring_recipe)
READY = re.compile(r"deepring: ready on (http://\S+)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not MISSING:
        return
    skip = pytest.mark.skip(
        reason="deepring_recipe lacks the serving API (" + ", ".join(MISSING) + ")"
    )
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


def _deepring() -> list[str]:
    exe = Path(sys.executable).with_name("deepring")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "deepring.cli"]


class Server:
    """`deepring serve --port 0 ...` with its output in a log file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [*_deepring(), "serve", "--port", "0", *args],
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

    def metric(self, name: str, labels: str = "", default: float | None = None) -> float:
        text = httpx2.get(f"{self.url}/metrics", timeout=10).text
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


@pytest.fixture(scope="session")
def server_env(tmp_path_factory) -> dict[str, str]:
    env = dict(os.environ)
    env["DEEPRING_CACHE_DIR"] = str(tmp_path_factory.mktemp("deepring-cache"))
    env["DEEPRING_HEARTBEAT_INTERVAL"] = "0.5"
    return env


@pytest.fixture(scope="session")
def start_server(tmp_path_factory, server_env):
    started: list[Server] = []

    def start(*args: str) -> Server:
        log = tmp_path_factory.mktemp("serve") / "serve.log"
        s = Server(list(args), log, server_env)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


# The shared server: small limits, so the flood test can fill them quickly.
SHARED_ARGS = (
    "--max-num-seqs",
    "8",
    "--max-queued-requests",
    "8",
    "--max-model-len",
    "1024",
    "--max-body-bytes",
    "262144",
)


@pytest.fixture(scope="session")
def server(start_server) -> Server:
    s = start_server(*SHARED_ARGS)
    yield s
    code = s.stop()
    assert code == 0, s.log()[-4000:]


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server.url


@pytest.fixture
def openai_client(base_url):
    import openai

    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
def anthropic_client(base_url):
    import anthropic

    with anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0) as c:
        yield c
