"""End-to-end fixtures: a real `deepring serve` in a subprocess on a free port.

Every test here drives the server through the official `openai` and `anthropic` SDKs (or raw
HTTP where the wire format itself is under test).
"""

from __future__ import annotations

import os

import pytest
from e2e_helpers import Server


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
    "--devices",  # (every worker on the CPU, placed by the per-worker list)
    "cpu",
)


@pytest.fixture(scope="session")
def server(start_server, tmp_path_factory) -> Server:
    traces = tmp_path_factory.mktemp("traces")
    s = start_server(*SHARED_ARGS, "--trace-dir", str(traces))
    s.trace_dir = traces  # each worker's step timeline (test_health_metrics)
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
