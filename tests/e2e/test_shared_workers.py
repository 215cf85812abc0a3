"""Two frontends sharing one pool of workers over tcp:// (CURVE), each role its own command as
on separate hosts, on the zero-cost model (its token at position p is a function of the
request's seed and p, so a request's output shows whose it is): both frontends get their own
requests' outputs, and one frontend's death costs the other nothing (its streams go on, new
requests are served) until it comes back and is served again."""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest
from e2e_helpers import RoleProcess, deepring_command, free_port

pytestmark = pytest.mark.slow

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Count to ten."}],
    "extra_body": {"thinking": {"type": "disabled"}},
}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _wait_workers(url: str, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(httpx2.get(f"{url}/health", timeout=10).json()["workers"]) < n:
        assert time.monotonic() < deadline, "the workers did not register"
        time.sleep(0.1)


def test_two_frontends_share_the_workers(tmp_path, server_env):
    env = {**server_env, "DEEPRING_HEARTBEAT_INTERVAL": "0.3", "DEEPRING_HEARTBEAT_TIMEOUT": "3"}
    keys = subprocess.run(
        [*deepring_command(), "ring-keys"], env=env, capture_output=True, text=True, timeout=120
    )
    assert keys.returncode == 0, keys.stderr
    rings = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    handoff = f"tcp://127.0.0.1:{free_port()}"
    model = ["--zero-cost", "--zero-cost-step-ms", "5"]

    def frontend(i: int, log: str) -> RoleProcess:
        args = ["frontend", "--ring", rings[i], "--port", "0", "--model", "tiny"]
        return RoleProcess(args, tmp_path / log, env)

    procs = {
        "a": frontend(0, "a.log"),
        "b": frontend(1, "b.log"),
        # One flag per frontend, or one flag with commas: both work.
        "prefill": RoleProcess(
            ["prefill", "--frontend", rings[0], "--frontend", rings[1], *model],
            tmp_path / "p.log",
            env,
        ),
        "decode": RoleProcess(
            ["decode", "--frontend", ",".join(rings), "--handoff-bind", handoff, *model],
            tmp_path / "d.log",
            env,
        ),
    }
    try:
        urls = {name: procs[name].url() for name in ("a", "b")}
        clients = {name: _client(url) for name, url in urls.items()}

        def one(i: int) -> str:
            """Request i through frontend a or b (alternating), with seed i // 2."""
            c = clients["ab"[i % 2]]
            r = c.chat.completions.create(max_tokens=24, seed=i // 2, **CHAT)
            assert r.usage.completion_tokens == 24
            return r.choices[0].message.content

        # Both frontends at once on the same workers (whose request ids may well collide):
        # each request gets the output of its own seed, whichever frontend it came through.
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(16)))
        assert answers[0::2] == answers[1::2]
        assert len(set(answers)) == 8
        for url in urls.values():
            workers = httpx2.get(f"{url}/health", timeout=10).json()["workers"]
            assert sorted(w["worker"] for w in workers) == ["decode-0", "prefill-0"]

        # Frontend a dies while b streams: b's stream goes on to its end, untouched.
        stream = clients["b"].chat.completions.create(
            max_tokens=300, stream=True, stream_options={"include_usage": True}, **CHAT
        )
        it = iter(stream)
        next(it)
        killer = threading.Timer(0.1, procs["a"].proc.kill)
        killer.start()
        usage = None
        for chunk in it:
            usage = chunk.usage or usage
        killer.join()
        assert usage is not None
        assert usage.completion_tokens == 300
        procs["a"].stop()
        # Past the heartbeat timeout (the workers give up on a): b still serves.
        time.sleep(3.5)
        assert one(3) == answers[3]
        # a comes back on the same ring endpoint: the workers register with it again.
        procs["a"] = frontend(0, "a2.log")
        urls["a"] = procs["a"].url()
        _wait_workers(urls["a"], 2)
        clients["a"] = _client(urls["a"])
        assert one(4) == answers[4]
        for c in clients.values():
            c.close()
        log = (tmp_path / "d.log").read_text()
        assert f"frontend {rings[0]} sent nothing for" in log
    finally:
        codes = {name: p.stop() for name, p in procs.items()}
    assert codes == {"a": 0, "b": 0, "prefill": 0, "decode": 0}
