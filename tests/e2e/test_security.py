"""Authentication end to end on a real `deepring serve --zero-cost --transport tcp`: API keys on
every route and protocol through the official SDKs (missing, wrong and right keys, from the
flag, the keys file and DEEPRING_API_KEY; the file re-read on SIGHUP; keys never logged),
per-key rate limits (429 with Retry-After in each protocol's shape), and the CURVE ring, which
ZeroMQ peers without its keys cannot join while the server keeps serving."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import anthropic
import httpx2
import msgpack
import openai
import pytest
import zmq
import zmq.auth
from e2e_helpers import Server

pytestmark = pytest.mark.slow

FLAG_KEY = "sk-flag-0000000001"
FILE_KEY = "sk-file-0000000002"
ENV_KEY = "sk-env-00000000003"
ROTATED_KEY = "sk-rotated-0000004"
AUTH = {"x-api-key": FLAG_KEY}
THINK_OFF = {"thinking": {"type": "disabled"}}
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("keys") / "api-keys"
    f.write_text(f"# the file's keys\n{FILE_KEY}\n")
    return f


@pytest.fixture(scope="module")
def secured(tmp_path_factory, server_env, keys_file):
    env = {**server_env, "DEEPRING_API_KEY": ENV_KEY}
    log = tmp_path_factory.mktemp("secured") / "serve.log"
    args = ["--zero-cost", "--transport", "tcp", "--api-key", FLAG_KEY]
    s = Server([*args, "--api-keys-file", str(keys_file)], log, env)
    yield s
    assert s.stop() == 0, s.log()[-4000:]


def _oai(server: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def _ant(server: Server, key: str | None = None, token: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, auth_token=token, max_retries=0)


def _openai_calls(c: openai.OpenAI, **kw) -> list:
    def chat(stream: bool):
        out = c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4, stream=stream, extra_body=THINK_OFF, **kw
        )
        return list(out) if stream else out

    def responses(stream: bool):
        out = c.responses.create(
            model="tiny", input="Say something.", max_output_tokens=4, stream=stream, **kw
        )
        return list(out) if stream else out

    return [
        ("chat", lambda: chat(False)),
        ("chat stream", lambda: chat(True)),
        ("responses", lambda: responses(False)),
        ("responses stream", lambda: responses(True)),
        ("models", lambda: c.models.list(**kw)),
    ]


def _messages(c: anthropic.Anthropic, stream: bool, **kw):
    out = c.messages.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=4,
        stream=stream,
        thinking={"type": "disabled"},
        **kw,
    )
    return list(out) if stream else out


@pytest.mark.parametrize("key", [None, "sk-wrong-000000000", FLAG_KEY + "x"])
def test_openai_routes_refuse_a_missing_or_wrong_key(secured, key):
    c = _oai(secured, key or "unused")
    extra = {"extra_headers": {"Authorization": openai.Omit()}} if key is None else {}
    for name, call in _openai_calls(c, **extra):
        with pytest.raises(openai.AuthenticationError) as e:
            call()
        assert e.value.status_code == 401, name
        assert e.value.response.headers["www-authenticate"] == "Bearer"
        err = e.value.body
        assert err["code"] == "invalid_api_key", name
        assert err["type"] == "invalid_request_error"
        assert ("missing" in err["message"]) == (key is None), name
    c.close()


@pytest.mark.parametrize("key", [None, "sk-wrong-000000000"])
@pytest.mark.parametrize("stream", [False, True])
def test_messages_refuse_a_missing_or_wrong_key(secured, key, stream):
    c = _ant(secured, key=key or "unused")
    extra = {"extra_headers": {"Authorization": anthropic.Omit()}} if key is None else {}
    with pytest.raises(anthropic.AuthenticationError) as e:
        _messages(c, stream, **extra)
    assert e.value.status_code == 401
    assert e.value.response.headers["www-authenticate"] == "Bearer"
    assert e.value.body == {
        "type": "error",
        "error": {
            "type": "authentication_error",
            "message": "invalid API key"
            if key
            else "missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
        },
    }
    c.close()


def test_metrics_needs_a_key_and_health_does_not(secured):
    r = httpx2.get(f"{secured.url}/metrics", timeout=10)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    r = httpx2.get(f"{secured.url}/metrics", headers={"x-api-key": FILE_KEY}, timeout=10)
    assert r.status_code == 200
    assert "deepring_http_auth_failures_total" in r.text
    assert httpx2.get(f"{secured.url}/health", timeout=10).status_code == 200
    # Unknown routes are not revealed without a key.
    assert httpx2.get(f"{secured.url}/nope", timeout=10).status_code == 401


@pytest.mark.parametrize("key", [FLAG_KEY, FILE_KEY, ENV_KEY])
def test_every_route_and_protocol_works_with_a_right_key(secured, key):
    c = _oai(secured, key)
    for name, call in _openai_calls(c):
        assert call(), name
    c.close()
    for client in (_ant(secured, key=key), _ant(secured, token=key)):
        assert _messages(client, False).usage.output_tokens == 4
        assert _messages(client, True)[-1].type == "message_stop"
        client.close()
    # Anthropic's own header, as its API documents it (this SDK sends a Bearer token).
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, **THINK_OFF}
    r = httpx2.post(f"{secured.url}/v1/messages", json=body, headers={"x-api-key": key}, timeout=30)
    assert r.status_code == 200
    assert r.json()["usage"]["output_tokens"] == 3
    r = httpx2.get(f"{secured.url}/metrics", headers={"authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200


def test_sighup_rereads_the_keys_file_and_keys_are_never_logged(secured, keys_file):
    keys_file.write_text(f"{ROTATED_KEY}\n")
    secured.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "SIGHUP: 3 API keys in force" not in secured.log():
        assert time.monotonic() < deadline, secured.log()[-2000:]
        time.sleep(0.1)
    assert _oai(secured, ROTATED_KEY).models.list().data[0].id == "tiny"
    with pytest.raises(openai.AuthenticationError):
        _oai(secured, FILE_KEY).models.list()
    assert _oai(secured, FLAG_KEY).models.list()  # flag and environment keys stay
    # A broken file keeps the keys in force.
    keys_file.write_text("not a key\n")
    secured.proc.send_signal(signal.SIGHUP)
    while "kept the API keys in force" not in secured.log():
        assert time.monotonic() < deadline + 30, secured.log()[-2000:]
        time.sleep(0.1)
    assert _oai(secured, ROTATED_KEY).models.list()
    log = secured.log()
    for key in (FLAG_KEY, FILE_KEY, ENV_KEY, ROTATED_KEY, "sk-wrong-000000000"):
        assert key not in log
    # Refusals are logged (at most one line per 10 s), naming keys by a hash prefix only.
    assert "without a valid API key" in log


def _ring_endpoints(server: Server) -> tuple[str, str]:
    ring = re.search(r"ring on (tcp://\S+) \(CURVE\)", server.log()).group(1)
    handoff = re.search(r"handoffs on (tcp://\S+)\)", server.log()).group(1)
    return ring, handoff


def test_the_tcp_ring_admits_no_peer_without_its_keys(secured, server_env):
    ring, handoff = _ring_endpoints(secured)
    # The servers' public key is no secret; a client key of one's own is not enough.
    keys_dir = Path(server_env["DEEPRING_CACHE_DIR"]) / "ring-keys"
    server_public = zmq.auth.load_certificate(keys_dir / "server.key")[0]
    before = {w["worker"]: w["pid"] for w in secured.health()["workers"]}
    ctx = zmq.Context()
    socks = []
    try:
        info = {"role": "prefill", "model": "tiny", "num_slots": 4, "num_blocks": 8}
        ready = msgpack.packb(
            {
                "t": "health",
                "v": 1,
                "worker": "prefill-0",
                "gen": 7,
                "state": "ready",
                "pid": 1,
                "info": info,
            }
        )
        stop = msgpack.packb({"t": "shutdown", "v": 1, "drain": False, "timeout": 0.0})
        for identity, keys in ((b"prefill-0/7", None), (b"decode-0/7", zmq.curve_keypair())):
            d = ctx.socket(zmq.DEALER)
            socks.append(d)
            d.linger = 0
            d.identity = identity
            if keys is not None:  # a CURVE client with a key of its own
                d.curve_serverkey = server_public
                d.curve_publickey, d.curve_secretkey = keys
            d.connect(ring)
            d.send_multipart([ready])
            p = ctx.socket(zmq.PUSH)
            socks.append(p)
            p.linger = 0
            p.connect(handoff)
            p.send_multipart([stop])
            p.send_multipart([b"abc"])
        # The server goes on serving; no prompt reaches the intruders.
        c = _oai(secured, FLAG_KEY)
        r = c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=6, extra_body=THINK_OFF
        )
        assert r.usage.completion_tokens == 6
        c.close()
        for d in socks[::2]:
            assert not d.poll(1000)
        assert secured.metric("deepring_ring_auth_denied_total", "", headers=AUTH) >= 1
        h = secured.health()
        assert h["status"] == "ok"
        assert {w["worker"]: w["pid"] for w in h["workers"]} == before
        assert all(w["ring_dropped"] == {} for w in h["workers"])
    finally:
        for s in socks:
            s.close()
        ctx.term()


RATE_KEYS = ["sk-rate-a-00000001", "sk-rate-b-00000002", "sk-rate-c-00000003"]


@pytest.fixture(scope="module")
def limited(start_server):
    args = ["--zero-cost", "--rate-limit-requests", "2/min", "--rate-limit-tokens", "400/min"]
    for k in RATE_KEYS:
        args += ["--api-key", k]
    return start_server(*args)


def test_request_rate_limit_per_key_with_retry_after(limited):
    a, b = RATE_KEYS[:2]
    c = _oai(limited, a)
    for _ in range(2):
        c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=2, extra_body=THINK_OFF
        )
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=2, extra_body=THINK_OFF
        )
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 30
    assert e.value.body["type"] == "rate_limit_error"
    assert "2/min requests" in e.value.body["message"]
    c.close()
    with pytest.raises(anthropic.RateLimitError) as e:
        _messages(_ant(limited, key=a), False)
    assert e.value.body["error"]["type"] == "rate_limit_error"
    assert int(e.value.response.headers["retry-after"]) >= 1
    # Another key has its own budget.
    assert _messages(_ant(limited, key=b), False).usage.output_tokens == 4


def test_token_rate_limit_counts_generated_tokens(limited):
    c = _oai(limited, RATE_KEYS[2])
    # More than the bucket holds: a full bucket lets it in, and its output runs it into debt.
    r = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=500, extra_body=THINK_OFF
    )
    assert r.usage.completion_tokens == 500
    with pytest.raises(openai.RateLimitError) as e:
        c.responses.create(model="tiny", input="Say something.", max_output_tokens=4)
    assert "tokens" in e.value.body["message"]
    assert int(e.value.response.headers["retry-after"]) >= 1
    c.close()
    text = httpx2.get(
        f"{limited.url}/metrics", headers={"x-api-key": RATE_KEYS[1]}, timeout=10
    ).text
    assert 'deepring_http_rate_limited_total{limit="tokens"} 1' in text
