"""The frontend's request guards through a real `deepring serve` (max_model_len 1024): a
prompt that fills the context, non-JSON and cross-site requests, HEAD."""

from __future__ import annotations

import socket

import httpx2
import openai
import pytest

CONTEXT = 1024  # the shared server's --max-model-len


def _words(n: int) -> list[dict]:
    return [{"role": "user", "content": "a " * n}]


def _prompt_tokens(client: openai.OpenAI, n: int) -> int:
    r = client.chat.completions.create(model="tiny", messages=_words(n), max_tokens=1)
    return r.usage.prompt_tokens


def test_a_prompt_that_fills_the_context_is_a_400_without_internal_names(openai_client):
    # Calibrate: prompt tokens grow by a fixed step per word of "a ".
    p10, p20 = _prompt_tokens(openai_client, 10), _prompt_tokens(openai_client, 20)
    step = (p20 - p10) // 10
    assert step >= 1
    assert (CONTEXT - p10) % step == 0
    n = 10 + (CONTEXT - p10) // step
    assert _prompt_tokens(openai_client, n - 1) == CONTEXT - step  # one less fits
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.chat.completions.create(model="tiny", messages=_words(n))
    message = err.value.body["message"]
    assert "leaves no room for output" in message
    for internal in ("prefill", "decode", "worker"):
        assert internal not in message


def test_non_json_and_cross_site_requests_are_refused(base_url):
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}'
    url = f"{base_url}/v1/chat/completions"
    r = httpx2.post(url, content=body, headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code == 415
    assert r.json()["error"]["code"] == "unsupported_media_type"
    headers = {"content-type": "application/json", "origin": "http://evil.example"}
    r = httpx2.post(url, content=body, headers=headers, timeout=30)
    assert r.status_code == 403
    r = httpx2.post(f"{base_url}/v1/messages", content=body, headers=headers, timeout=30)
    assert (r.status_code, r.json()["error"]["type"]) == (403, "permission_error")


def test_head_is_get_without_the_body(base_url):
    get = httpx2.get(f"{base_url}/v1/models", timeout=30)
    head = httpx2.head(f"{base_url}/v1/models", timeout=30)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == str(len(get.content))


def _refused(base_url: str) -> dict[str, float]:
    text = httpx2.get(f"{base_url}/metrics", timeout=30).text
    prefix = 'deepring_http_refused_total{reason="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def test_requests_the_limits_refuse_are_counted_in_metrics(base_url):
    before = _refused(base_url)
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (20 << 10) + b"\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 431 ")
    after = _refused(base_url)
    assert after.get("head_too_large", 0) == before.get("head_too_large", 0) + 1
