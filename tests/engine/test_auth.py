"""API keys and per-key rate limits of the frontend, without a server: which headers carry a
key, every route but /health refused without one in its protocol's error shape, constant-time
matching over every key, the keys file (comments, bad lines, SIGHUP reload that never turns
authentication off), keys kept out of reprs and logs, token buckets and Retry-After."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from deepring import cli
from deepring.config import FrontendConfig, RateLimit
from deepring.frontend import auth
from deepring.frontend.app import App
from deepring.frontend.auth import ApiKeys, Authenticator, key_id, presented_keys, read_keys_file
from deepring.frontend.metrics import Metrics
from deepring.frontend.ratelimit import RateLimiter, TokenBucket
from deepring.protocol.errors import ApiError

RING = "ipc:///tmp/deepring-test-ring"
K1 = "sk-first-key-0001"
K2 = "sk-second-key-0002"


class Req:
    """The HttpRequest surface the frontend's routes use, recording the response."""

    def __init__(self, path: str, method: str = "GET", headers: dict | None = None) -> None:
        self.path, self.method = path, method
        # A JSON body, as every API client sends (other content types get 415 on POST).
        self.headers = {"content-type": "application/json", **(headers or {})}
        self.body = b"{}"
        self.started = False
        self.disconnected = False
        self.status = self.response = self.response_headers = None

    def respond(self, status, body, content_type="application/json", headers=None) -> None:
        self.started = True
        self.status, self.response, self.response_headers = status, body, dict(headers or [])


class Workers:
    """The EngineClient surface App reads, with no worker up."""

    def __init__(self) -> None:
        self.ready = False
        self.workers: dict = {}
        self.requests: dict = {}
        self.queued = 0

    def info(self, key: str):
        return None


def _app(**kw) -> App:
    return App(FrontendConfig(ring_addr=RING, **kw), Workers(), Metrics())


def _call(app: App, req: Req) -> Req:
    asyncio.run(app.handle(req))
    return req


@pytest.mark.parametrize(
    ("headers", "keys"),
    [
        ({"authorization": f"Bearer {K1}"}, [K1]),
        ({"authorization": f"bearer  {K1} "}, [K1]),
        ({"x-api-key": K1}, [K1]),
        ({"authorization": f"Bearer {K1}", "x-api-key": K2}, [K1, K2]),
        ({"authorization": f"Basic {K1}"}, []),
        ({"authorization": "Bearer "}, []),
        ({}, []),
    ],
)
def test_keys_come_from_the_bearer_token_or_x_api_key(headers, keys):
    assert presented_keys(Req("/v1/models", headers=headers)) == keys


ROUTES = [
    ("/v1/chat/completions", "POST", "openai"),
    ("/v1/responses", "POST", "openai"),
    ("/v1/messages", "POST", "anthropic"),
    ("/v1/models", "GET", "openai"),
    ("/metrics", "GET", "openai"),
    ("/no/such/route", "GET", "openai"),
]


@pytest.mark.parametrize(("path", "method", "shape"), ROUTES)
@pytest.mark.parametrize("given", [None, "sk-wrong-key-0000", K1[:-1], K1 + "x"])
def test_every_route_but_health_needs_a_key(path, method, shape, given):
    app = _app(api_keys=(K1, K2))
    headers = {} if given is None else {"authorization": f"Bearer {given}"}
    req = _call(app, Req(path, method, headers))
    assert req.status == 401
    assert req.response_headers["www-authenticate"] == "Bearer"
    body = json.loads(req.response)
    if shape == "anthropic":
        assert body["type"] == "error"
        assert body["error"]["type"] == "authentication_error"
        message = body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "invalid_api_key"
        message = body["error"]["message"]
    assert ("missing" in message) == (given is None)
    if given is not None:
        assert given not in message
    assert app.metrics.auth_failures == 1


def test_a_right_key_passes_on_every_route_and_health_is_open():
    app = _app(api_keys=(K1, K2))
    # Past authentication: the model list answers, generation says the server is starting.
    assert _call(app, Req("/v1/models", headers={"authorization": f"Bearer {K2}"})).status == 200
    assert _call(app, Req("/metrics", headers={"x-api-key": K1})).status == 200
    req = _call(app, Req("/v1/messages", "POST", {"x-api-key": K1}))
    assert req.status == 503
    assert _call(app, Req("/health")).status == 503  # starting, but no 401
    assert app.metrics.auth_failures == 0


def test_without_keys_nothing_is_checked():
    app = _app()
    assert not app.auth.enabled
    assert _call(app, Req("/v1/models")).status == 200


def test_matching_compares_every_key_and_keeps_only_hashes(monkeypatch):
    keys = ApiKeys((K1, K2, "sk-third-key-0003"))
    compared = []
    real = auth.hmac.compare_digest

    def counting(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    assert keys.match([K1]) == key_id(K1)
    # No early exit on the first key: all three were compared, as for a wrong key.
    assert len(compared) == 3
    compared.clear()
    assert keys.match(["sk-nope-nope-nope"]) is None
    assert len(compared) == 3
    assert all(len(a) == len(b) == 32 for a, b in compared)  # digests, never raw keys
    assert K1 not in repr(vars(keys))


def test_keys_stay_out_of_reprs_logs_and_errors(caplog, capsys, tmp_path):
    cfg = FrontendConfig(ring_addr=RING, api_keys=(K1,))
    assert K1 not in repr(cfg)
    app = App(cfg, Workers(), Metrics())
    with caplog.at_level(logging.WARNING, logger="deepring.frontend"):
        _call(app, Req("/v1/models", headers={"x-api-key": "sk-guess-guess-1"}))
    assert "sk-guess-guess-1" not in caplog.text
    assert key_id("sk-guess-guess-1") in caplog.text
    # A bad key on the command line is refused without echoing it.
    bad = "short"
    assert cli.main(["serve", "--api-key", bad, "--zero-cost"]) == 2
    err = capsys.readouterr().err
    assert "--api-key must be 8 to 256 printable ASCII" in err
    assert f" {bad}" not in err


def test_keys_file_comments_bad_lines_and_empty(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"# team a\n{K1}\n\n   {K2}  \n# end\n")
    assert read_keys_file(f) == [K1, K2]
    f.write_text(f"{K1}\nnot a key\n")
    with pytest.raises(ValueError, match="line 2") as e:
        read_keys_file(f)
    assert K1 not in str(e.value)
    f.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="holds no API key"):
        read_keys_file(f)


def test_reload_reads_the_file_again_and_keeps_keys_when_it_is_broken(tmp_path, caplog):
    f = tmp_path / "keys"
    f.write_text(f"{K1}\n")
    a = Authenticator(
        FrontendConfig(ring_addr=RING, api_keys=(K2,), api_keys_file=str(f)), Metrics()
    )
    assert a.keys.match([K1])
    assert a.keys.match([K2])
    f.write_text("sk-rotated-key-9999\n")
    a.reload()
    assert a.keys.match([K1]) is None
    assert a.keys.match(["sk-rotated-key-9999"])
    assert a.keys.match([K2])
    for broken in ("", "bad key with spaces\n"):
        f.write_text(broken)
        with caplog.at_level(logging.ERROR, logger="deepring.frontend"):
            a.reload()
        assert "kept the API keys in force" in caplog.text
        assert a.keys.match(["sk-rotated-key-9999"])  # authentication never turns off
    f.unlink()
    a.reload()
    assert a.keys.match(["sk-rotated-key-9999"])


@pytest.mark.parametrize(
    ("text", "amount", "per_s"),
    [("60/min", 60, 60), ("5/s", 5, 1), ("1000/h", 1000, 3600), (" 2.5 / m ", 2.5, 60)],
)
def test_rates_parse(text, amount, per_s):
    r = RateLimit.parse(text)
    assert (r.amount, r.per_s) == (amount, per_s)


@pytest.mark.parametrize("text", ["60", "60/day", "0/min", "-1/s", "x/s", "inf/s", "nan/s", ""])
def test_bad_rates_are_refused(text):
    with pytest.raises(ValueError, match="N/s, N/min or N/h"):
        RateLimit.parse(text)


def test_rate_limits_need_api_keys(capsys):
    with pytest.raises(ValueError, match="per API key"):
        FrontendConfig(ring_addr=RING, rate_limit_requests=RateLimit(1, 1))
    assert cli.main(["serve", "--rate-limit-tokens", "10/min"]) == 2
    assert "per API key" in capsys.readouterr().err


def test_token_bucket_bursts_refills_and_takes_debt():
    b = TokenBucket(RateLimit(3, 60), now=0.0)  # 3 a minute: one every 20 s
    assert [b.take(1, 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(1, 0.0) == pytest.approx(20.0)
    assert b.take(1, 10.0) == pytest.approx(10.0)
    assert b.take(1, 20.0) == 0.0
    # More than the bucket holds: a full bucket lets it through, and the rest is debt.
    b = TokenBucket(RateLimit(100, 60), now=0.0)
    assert b.take(250, 0.0) == 0.0
    assert b.level == -150
    assert b.take(10, 0.0) == pytest.approx(160 * 60 / 100)
    b.charge(40, 0.0)
    assert b.level == -190


class Sink:
    def __init__(self) -> None:
        self.got: list = []

    def start(self, cache_hit: int) -> None:
        self.got.append(("start", cache_hit))

    def tokens(self, ids, finish, logprobs=None) -> bool:
        self.got.append(("tokens", list(ids), finish))
        return False

    def error(self, message: str, status: int = 500) -> None:
        self.got.append(("error", message, status))


def test_limits_are_per_key_with_retry_after():
    now = [0.0]
    m = Metrics()
    lim = RateLimiter(RateLimit(2, 60), RateLimit(100, 60), m, clock=lambda: now[0])
    lim.admit_request("key-a")
    lim.admit_request("key-a")
    with pytest.raises(ApiError) as e:
        lim.admit_request("key-a")
    assert e.value.status == 429
    assert dict(e.value.headers)["retry-after"] == "30"
    assert "2/min requests" in e.value.message
    lim.admit_request("key-b")  # another key has its own bucket
    lim.admit_request(None)  # no key configured: no limit
    # Tokens: the prompt is taken up front, generated tokens as they stream.
    lim.admit_tokens("key-a", 30)
    inner = Sink()
    sink = lim.metered("key-a", inner)
    sink.start(0)
    sink.tokens([1] * 80, None)
    sink.tokens([2] * 5, "length")
    sink.error("x", 503)
    assert inner.got[0] == ("start", 0)
    assert inner.got[-1] == ("error", "x", 503)
    with pytest.raises(ApiError) as e:
        lim.admit_tokens("key-a", 10)  # 100 - 30 - 85 = -15: 25 tokens short, 0.6 s each
    assert dict(e.value.headers)["retry-after"] == "15"
    now[0] = 15.0
    lim.admit_tokens("key-a", 10)
    assert m.rate_limited == {"requests": 1, "tokens": 1}
    assert lim.metered(None, inner) is inner
