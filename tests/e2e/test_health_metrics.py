"""/health and /metrics of a running server."""

from __future__ import annotations

import json
import time

import httpx2


def test_health_lists_ready_workers(server):
    h = server.health()
    assert h["status"] == "ok"
    assert h["model"] == "tiny"
    roles = sorted(w["role"] for w in h["workers"])
    assert roles == ["decode", "prefill"]
    assert all(w["up"] == 1 and w["pid"] > 0 for w in h["workers"])
    assert [w["device"] for w in h["workers"]] == ["cpu", "cpu"]  # --devices cpu


def test_metrics_after_requests(server, openai_client):
    for _ in range(2):
        openai_client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "count"}],
            max_tokens=6,
            extra_body={"thinking": {"type": "disabled"}},
        )
    r = httpx2.get(f"{server.url}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        "deepring_time_to_first_token_seconds_bucket",
        "deepring_time_per_output_token_seconds_bucket",
        "deepring_generation_tokens_per_second",
        "deepring_frontend_requests_queued",
        'deepring_worker_queue_length{worker="prefill-0",role="prefill"}',
        'deepring_worker_running_requests{worker="decode-0",role="decode"}',
        'deepring_worker_kv_blocks_used{worker="decode-0",role="decode"}',
    ):
        assert name in text, name
    assert server.metric("deepring_time_to_first_token_seconds_count") >= 2
    assert server.metric("deepring_time_per_output_token_seconds_count") >= 2
    assert server.metric("deepring_generation_tokens_total") >= 12
    assert server.metric("deepring_requests_total", '{outcome="finished"}') >= 2
    # Every histogram line parses as Prometheus text.
    for line in text.splitlines():
        if line and not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])


def test_step_timeline_and_compute_share(server, openai_client):
    """--trace-dir: every worker writes a Chrome trace of its loop, with the overlapped
    engine's schedule / wait / launch / post inside `step` spans and each step's compute on a
    track of its own, from its launch to the end of the wait for its tokens; /metrics splits
    the busy time into the model runner's share and the rest."""
    for _ in range(2):
        openai_client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
            extra_body={"thinking": {"type": "disabled"}},
        )  # fmt: skip
    for wid in ("prefill-0", "decode-0"):
        path = server.trace_dir / f"{wid}.trace.json"
        deadline = time.monotonic() + 30
        while '"compute"' not in path.read_text():  # written within a second (FLUSH_S)
            assert time.monotonic() < deadline, path.read_text()[-2000:]
            openai_client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                extra_body={"thinking": {"type": "disabled"}},
            )  # fmt: skip
            time.sleep(0.6)
        text = path.read_text()
        # The worker still writes: the array is open (the viewers take it so).
        events = json.loads(text.rstrip().rstrip(",") + "]")
        spans = [e for e in events if e.get("ph") == "X"]
        names = {e["name"] for e in spans}
        assert {"poll", "step", "schedule", "wait", "launch", "compute", "post"} <= names
        threads = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        ends = {n: {round(e["ts"] + e["dur"]) for e in spans if e["name"] == n}
                for n in ("launch", "wait")}  # fmt: skip
        for c in (e for e in spans if e["name"] == "compute"):
            # On its own track, carrying the step's shape, from a launch to a wait's end.
            assert threads[c["tid"]] == "compute"
            assert c["args"]["tokens"] >= c["args"]["seqs"] >= 1
            assert {round(c["ts"]) + d for d in (-1, 0, 1)} & ends["launch"]
            assert {round(c["ts"] + c["dur"]) + d for d in (-1, 0, 1)} & ends["wait"]
    labels = '{worker="decode-0",role="decode"}'
    compute = server.metric("deepring_worker_compute_seconds_total", labels)
    busy = server.metric("deepring_worker_busy_seconds_total", labels)
    steps = server.metric("deepring_worker_step_seconds_total", labels)
    assert 0 < compute <= steps <= busy
