"""Other process layouts, on the zero-cost model (quick to start, no compute): several
workers per role over tcp://, and each role as its own command (as on separate hosts), where
a dead worker is noticed by its missing heartbeats instead of its exit."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest
from e2e_helpers import READY, RoleProcess, deepring_command, free_port

pytestmark = pytest.mark.slow

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Count."}],
    "thinking": {"type": "disabled"},
}


SDK_CHAT = {
    "model": "tiny",
    "messages": CHAT["messages"],
    "extra_body": {"thinking": CHAT["thinking"]},
}


def test_two_workers_per_role_over_tcp(start_server):
    s = start_server(
        "--zero-cost",
        "--num-prefill",
        "2",
        "--num-decode",
        "2",
        "--transport",
        "tcp",
        "--max-num-seqs",
        "4",
    )
    roles = sorted(w["worker"] for w in s.health()["workers"])
    assert roles == ["decode-0", "decode-1", "prefill-0", "prefill-1"]

    def one(i: int) -> dict:
        r = httpx2.post(f"{s.url}/v1/chat/completions", json={**CHAT, "max_tokens": 64}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert all(r["usage"]["completion_tokens"] == 64 for r in results)
    # The router spread the work over every worker. The counters come with the workers' load
    # reports, which may land after the last response (a failed run read 0 for a prefill worker
    # that had served its requests): wait for them, bounded.
    for wid in ("prefill-0", "prefill-1", "decode-0", "decode-1"):
        role = wid.split("-")[0]
        labels = f'{{worker="{wid}",role="{role}"}}'
        deadline = time.monotonic() + 15
        while s.metric("deepring_worker_generated_tokens_total", labels) == 0:
            assert time.monotonic() < deadline, f"{wid} reported no tokens"
            time.sleep(0.2)
    assert s.stop() == 0


def test_roles_as_separate_commands(tmp_path, server_env):
    env = {**server_env, "DEEPRING_HEARTBEAT_INTERVAL": "0.3", "DEEPRING_HEARTBEAT_TIMEOUT": "3"}
    # The tcp:// ring is CURVE-secured: the workers need the key directory before they start
    # (on separate hosts it is copied; here all share DEEPRING_CACHE_DIR/ring-keys).
    keys = subprocess.run(
        [*deepring_command(), "ring-keys"], env=env, capture_output=True, text=True, timeout=120
    )
    assert keys.returncode == 0, keys.stderr
    ring = f"tcp://127.0.0.1:{free_port()}"
    handoff = f"tcp://127.0.0.1:{free_port()}"
    decode_args = [
        "decode",
        "--frontend",
        ring,
        "--handoff-bind",
        handoff,
        "--zero-cost",
        "--zero-cost-step-ms",
        "10",
    ]
    frontend_args = ["frontend", "--ring", ring, "--port", "0", "--queue-timeout", "3"]
    roles = {
        "frontend": RoleProcess(frontend_args, tmp_path / "fe.log", env),
        "prefill": RoleProcess(
            ["prefill", "--frontend", ring, "--zero-cost"], tmp_path / "p.log", env
        ),
        "decode": RoleProcess(decode_args, tmp_path / "d.log", env),
    }
    try:
        deadline = time.monotonic() + 240
        while not (m := READY.search((tmp_path / "fe.log").read_text())):
            assert time.monotonic() < deadline, (tmp_path / "fe.log").read_text()
            time.sleep(0.1)
        url = m.group(1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(max_tokens=8, **SDK_CHAT)
        assert r.usage.completion_tokens == 8
        # Kill the only decode worker while it streams: no process exit to watch from here, so
        # the frontend notices the silence and reroutes the request, which then waits for a
        # decode worker; none comes within --queue-timeout, so it fails, saying why.
        stream = client.chat.completions.create(max_tokens=2000, stream=True, **SDK_CHAT)
        it = iter(stream)
        next(it)
        killer = threading.Timer(0.2, roles["decode"].proc.kill)
        killer.start()
        with pytest.raises(openai.APIError, match="no decode worker is available"):
            for _ in it:
                pass
        stream.close()
        roles["decode"].stop()
        # No decode worker now: a request waits --queue-timeout seconds, then gets 503.
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(max_tokens=8, **SDK_CHAT)
        assert e.value.status_code == 503
        assert "no decode worker is available" in e.value.message
        # A new decode process on the same endpoints registers and serves.
        roles["decode"] = RoleProcess(decode_args, tmp_path / "d2.log", env)
        deadline = time.monotonic() + 240
        while httpx2.get(f"{url}/health", timeout=10).json()["status"] != "ok":
            assert time.monotonic() < deadline, "the new decode worker did not register"
            time.sleep(0.1)
        r = client.chat.completions.create(max_tokens=8, **SDK_CHAT)
        assert r.usage.completion_tokens == 8
        client.close()
        # The frontend dies and a new one binds the same ring: the workers register with it.
        roles["frontend"].stop(signal.SIGKILL)
        roles["frontend"] = RoleProcess(frontend_args, tmp_path / "fe2.log", env)
        deadline = time.monotonic() + 240
        while not (m := READY.search((tmp_path / "fe2.log").read_text())):
            assert time.monotonic() < deadline, (tmp_path / "fe2.log").read_text()
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"{m.group(1)}/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(max_tokens=8, **SDK_CHAT)
        assert r.usage.completion_tokens == 8
        client.close()
    finally:
        codes = {name: role.stop() for name, role in roles.items()}
    # Each role drains and exits cleanly on SIGTERM.
    assert codes == {"frontend": 0, "prefill": 0, "decode": 0}


def test_workers_join_and_leave_at_run_time(tmp_path, server_env):
    """A decode worker started while the server runs joins and gets requests; one stopped with
    SIGTERM drains: it finishes its streams, the frontend sends it nothing new (a request it
    refused in the meantime goes elsewhere), and /health stays ok, since it left on purpose."""
    env = {**server_env, "DEEPRING_HEARTBEAT_INTERVAL": "0.3", "DEEPRING_HEARTBEAT_TIMEOUT": "5"}
    keys = subprocess.run(
        [*deepring_command(), "ring-keys"], env=env, capture_output=True, text=True, timeout=120
    )
    assert keys.returncode == 0, keys.stderr
    ring = f"tcp://127.0.0.1:{free_port()}"

    def decode(i: int) -> RoleProcess:
        handoff = f"tcp://127.0.0.1:{free_port()}"
        args = ["decode", "--frontend", ring, "--index", str(i), "--handoff-bind", handoff,
                "--zero-cost", "--zero-cost-step-ms", "10"]  # fmt: skip
        return RoleProcess(args, tmp_path / f"d{i}.log", env)

    roles = {
        "frontend": RoleProcess(
            ["frontend", "--ring", ring, "--port", "0", "--router", "tokens"],
            tmp_path / "fe.log",
            env,
        ),
        "prefill": RoleProcess(
            ["prefill", "--frontend", ring, "--zero-cost"], tmp_path / "p.log", env
        ),
        "decode-0": decode(0),
    }
    try:
        url = roles["frontend"].url()
        roles["decode-1"] = decode(1)
        deadline = time.monotonic() + 240
        while len(httpx2.get(f"{url}/health", timeout=10).json()["workers"]) < 3:
            assert time.monotonic() < deadline, "the second decode worker did not join"
            time.sleep(0.1)

        def one(n: int) -> int:
            r = httpx2.post(
                f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": n}, timeout=120
            )
            assert r.status_code == 200, r.text
            return r.json()["usage"]["completion_tokens"]

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, [40] * 8)) == [40] * 8
        health = httpx2.get(f"{url}/health", timeout=10).json()
        served = {w["worker"]: w["generated_tokens_total"] for w in health["workers"]}
        assert served["decode-0"] > 0, served
        assert served["decode-1"] > 0, served
        # decode-1 leaves while requests stream (100 tokens x 10 ms steps: a second each).
        with ThreadPoolExecutor(8) as pool:
            running = [pool.submit(one, 100) for _ in range(8)]
            time.sleep(0.5)
            roles["decode-1"].proc.send_signal(signal.SIGTERM)
            assert roles["decode-1"].proc.wait(60) == 0
            late = [pool.submit(one, 20) for _ in range(4)]
            assert [f.result() for f in running] == [100] * 8
            assert [f.result() for f in late] == [20] * 4
        health = httpx2.get(f"{url}/health", timeout=10).json()
        assert health["status"] == "ok", health
        assert [w["worker"] for w in health["workers"] if w["role"] == "decode"] == ["decode-0"]
    finally:
        codes = {name: role.stop() for name, role in roles.items()}
    assert all(code == 0 for code in codes.values()), codes
