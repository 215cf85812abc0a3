"""The frontend's sinks over deepring_recipe's stream processing, without a server: SSE
framing per protocol, EOS kept out of the text, a stop sequence ending the request early, the
error event of each protocol, and non-streamed responses equal to the streamed ones."""

from __future__ import annotations

import json

import pytest
from deepring.frontend.stream import JsonSink, SseSink
from deepring.protocol.formats import PromptFormat
from deepring.protocol.prepare import CHAT, MESSAGES, RESPONSES, Recipe

EOS = 1


class FakeHttp:
    """Records what a sink writes instead of sending it."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.chunks: list[bytes] = []
        self.body: bytes | None = None
        self.ended = False

    @property
    def started(self) -> bool:
        return self.status is not None

    def start_stream(self, status=200, content_type="text/event-stream", headers=None, first=b""):
        self.status = status
        self.chunks.append(first)

    def write(self, data: bytes) -> None:
        assert not self.ended
        self.chunks.append(data)

    def end_stream(self, last: bytes = b"") -> None:
        self.chunks.append(last)
        self.ended = True

    def respond(self, status, body, content_type="application/json", headers=None) -> None:
        self.status, self.body, self.ended = status, body, True

    def events(self) -> list[tuple[str | None, str]]:
        out = []
        for block in b"".join(self.chunks).decode().split("\n\n")[:-1]:
            name = None
            data = ""
            for line in block.split("\n"):
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data = line[6:]
                else:
                    raise AssertionError(f"bad SSE line {line!r}")
            out.append((name, data))
        return out


@pytest.fixture(scope="module")
def recipe(v41_tokenizer_path):
    return Recipe(v41_tokenizer_path, ["tiny"], PromptFormat.V41)


BODIES = {
    CHAT: {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "disabled"},
    },
    RESPONSES: {"model": "tiny", "input": "hi", "reasoning": {"effort": "none"}},
    MESSAGES: {
        "model": "tiny",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "disabled"},
    },
}


def _prepare(recipe: Recipe, api, stream: bool, **extra):
    body = json.dumps({**BODIES[api], "stream": stream, **extra}).encode()
    return recipe.prepare(api, body, 4096)


@pytest.mark.parametrize("api", [CHAT, RESPONSES, MESSAGES], ids=lambda a: a.name)
def test_streamed_and_accumulated_agree_and_eos_is_not_text(recipe, api):
    text_ids = recipe.tokenizer.encode("Hello there, general")
    http = FakeHttp()
    sink = SseSink(http, _prepare(recipe, api, True), frozenset({EOS}))
    sink.start(cache_hit=0)
    assert sink.tokens(text_ids[:2], None) is False
    assert sink.tokens([*text_ids[2:], EOS], "stop") is True
    assert http.ended
    events = http.events()
    if api is CHAT:
        assert all(name is None for name, _ in events)
        assert events[-1] == (None, "[DONE]")
        chunks = [json.loads(d) for _, d in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["usage"]["completion_tokens"] == len(text_ids)
    else:
        assert all(name == json.loads(d)["type"] for name, d in events)
        key = "delta" if api is RESPONSES else None
        parts = []
        for _, d in events:
            e = json.loads(d)
            if api is RESPONSES and e["type"] == "response.output_text.delta":
                parts.append(e[key])
            if api is MESSAGES and e["type"] == "content_block_delta":
                parts.append(e["delta"].get("text", ""))
        text = "".join(parts)
    assert text == "Hello there, general"
    assert "end▁of▁sentence" not in b"".join(http.chunks).decode()
    # The same tokens through the non-streaming path.
    http2 = FakeHttp()
    sink2 = JsonSink(http2, _prepare(recipe, api, False), frozenset({EOS}))
    sink2.start(cache_hit=0)
    sink2.tokens(text_ids[:2], None)
    sink2.tokens([*text_ids[2:], EOS], "stop")
    assert http2.status == 200
    assert "Hello there, general" in http2.body.decode()


def test_a_stop_sequence_ends_the_stream_early(recipe):
    http = FakeHttp()
    prep = _prepare(recipe, CHAT, True, stop=["there"])
    sink = SseSink(http, prep, frozenset({EOS}))
    sink.start(cache_hit=3)
    done = sink.tokens(recipe.tokenizer.encode("Hello there, general"), None)
    assert done is True  # the client aborts the rest in the engine
    chunks = [json.loads(d) for _, d in http.events()[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello "
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["prompt_cache_hit_tokens"] == 3


@pytest.mark.parametrize("api", [CHAT, RESPONSES, MESSAGES], ids=lambda a: a.name)
def test_error_events_in_each_protocol(recipe, api):
    http = FakeHttp()
    sink = SseSink(http, _prepare(recipe, api, True), frozenset({EOS}))
    sink.start(cache_hit=0)
    sink.tokens(recipe.tokenizer.encode("Hi"), None)
    before = len(http.events())
    sink.error("decode worker decode-0 exited")
    assert http.ended
    name, data = http.events()[-1]
    err = json.loads(data)
    if api is CHAT:
        assert name is None
        assert err["error"]["type"] == "server_error"
        assert err["error"]["message"] == "decode worker decode-0 exited"
    elif api is RESPONSES:
        assert name == "error"
        assert err["type"] == "error"
        assert err["sequence_number"] == before  # the next number in the stream
    else:
        assert name == "error"
        assert err == {
            "type": "error",
            "error": {"type": "api_error", "message": "decode worker decode-0 exited"},
        }
    # An error before anything was streamed still makes a well-formed stream.
    http = FakeHttp()
    SseSink(http, _prepare(recipe, api, True), frozenset()).error("no worker")
    assert http.status == 200
    assert http.ended


def test_non_streaming_errors_are_http_errors(recipe):
    for api, shape in ((CHAT, "error"), (MESSAGES, "type")):
        http = FakeHttp()
        JsonSink(http, _prepare(recipe, api, False), frozenset()).error("gone")
        assert http.status == 500
        assert shape in json.loads(http.body)


def test_a_request_before_the_workers_report_is_told_the_server_is_starting(v41_tokenizer_path):
    """Until the workers are up no tokenizer is known: a request then gets the plain 503
    "starting", not advice to restart the frontend with --tokenizer; once they are up and none
    reported one, it does; a reported tokenizer builds the protocol objects."""
    import asyncio

    from deepring.config import FrontendConfig
    from deepring.frontend.app import App
    from deepring.frontend.metrics import Metrics
    from deepring.protocol.errors import ApiError

    class Workers:  # the EngineClient surface load_recipe reads
        ready = False
        tokenizer = None

        def info(self, key: str):
            return self.tokenizer if key == "tokenizer" else None

    class Req:
        path, method = "/v1/chat/completions", "POST"

    workers = Workers()
    app = App(FrontendConfig(ring_addr="ipc:///tmp/deepring-test-ring"), workers, Metrics())
    with pytest.raises(ApiError) as err:
        asyncio.run(app._generate(CHAT, Req()))
    assert err.value.status == 503
    assert "starting" in str(err.value)
    assert "--tokenizer" not in str(err.value)
    workers.ready = True
    app.load_recipe()
    assert "--tokenizer" in app.recipe_error
    workers.tokenizer = v41_tokenizer_path
    app.load_recipe()
    assert app.recipe is not None
    assert app.recipe_error is None
