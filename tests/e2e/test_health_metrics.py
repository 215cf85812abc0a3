"""/health and /metrics of a running server."""

from __future__ import annotations

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
