"""Images through serving: `deepring serve --model v41-tiny` (a vision tower; prefill chunks of
64 tokens, so an image's span is cut across steps) takes image content of the three APIs, runs
the tower in the prefill worker and hands the image on with the request.

Checked against offline decoding of the same body in one process (`LLM.generate`, which runs
the engine on the same prompt and pixels without rings, workers or handoffs), greedy: plain,
streamed, a second turn that hits the prefix cache past the image, the same text with another
image (a hit only before it), a decode worker killed mid-stream (the request is resubmitted with
its image and goes on unchanged). The official SDKs are the clients. Image URLs are fetched
from the allow-listed host only (the test's 127.0.0.1 server, private addresses allowed; the
refusal without a list is tests/engine/test_image_intake.py's), and a corrupt image is a 400."""

from __future__ import annotations

import base64
import http.server
import io
import os
import signal
import threading
import time

import anthropic
import openai
import pytest
import torch
from deepring import LLM, SamplingParams
from PIL import Image

pytestmark = pytest.mark.slow

THINKING = {"type": "disabled"}
VOCAB = 129281  # v41-tiny's: an image span starts with this id
ARGS = ("--model", "v41-tiny", "--max-num-seqs", "4", "--max-model-len", "2048",
        "--default-thinking", "off", "--num-decode", "2",
        "--prefill-max-num-batched-tokens", "64",
        # Image URLs from the test's own 127.0.0.1 server only.
        "--image-url-hosts", "127.0.0.1", "--image-url-allow-private")  # fmt: skip
TEXT = " ".join(f"note {i}: the value is {i * 37 % 101}." for i in range(30))


def _png(color: tuple[int, int, int], size=(120, 64)) -> bytes:
    im = Image.new("RGB", size, color)
    for x in range(0, size[0], 7):  # some structure, so that the pixels matter
        im.putpixel((x, x % size[1]), (x % 256, 255 - x % 256, 90))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def _url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


RED, BLUE = _png((200, 20, 20)), _png((20, 20, 200))


def _chat(image: bytes, question: str = "What is in the picture?") -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "text", "text": TEXT},
        {"type": "image_url", "image_url": {"url": _url(image)}},
        {"type": "text", "text": question},
    ]}]  # fmt: skip


def _offline(bodies: list[list[dict]], max_tokens: int) -> list:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    try:
        out = []
        for m in bodies:  # a fresh engine per body: nothing comes from a cache
            llm = LLM("v41-tiny", max_model_len=2048)
            out.append(llm.generate({"model": "v41-tiny", "messages": m, "thinking": THINKING},
                                    params)[0])  # fmt: skip
        return out
    finally:
        torch.set_flush_denormal(False)  # process-wide; later hypothesis suites refuse it


@pytest.fixture(scope="module")
def served(start_server):
    s = start_server(*ARGS)
    yield s
    assert s.stop() == 0, s.log()[-4000:]


def _client(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=300)


KW = {"model": "v41-tiny", "temperature": 0, "extra_body": {"thinking": THINKING}}


def test_image_chats_equal_offline_decoding_and_hit_the_cache_only_for_the_same_image(served):
    first = _chat(RED)
    second = [*first, {"role": "assistant", "content": "a red square."},
              {"role": "user", "content": "and the colour again?"}]  # fmt: skip
    other = _chat(BLUE)
    images = served.metric("deepring_prompt_images_total")
    with _client(served) as c:
        whole = c.chat.completions.create(messages=first, max_tokens=12, **KW)
        parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            messages=first, max_tokens=12, stream=True, **KW) if ch.choices]  # fmt: skip
        later = c.chat.completions.create(messages=second, max_tokens=12, **KW)
        blue = c.chat.completions.create(messages=other, max_tokens=12, **KW)
    assert served.metric("deepring_prompt_images_total") == images + 4
    want = _offline([first, second, other], 12)
    texts = [w.text.removeprefix("\n") for w in want]
    assert whole.choices[0].message.content == texts[0]
    assert "".join(parts) == texts[0]
    assert whole.usage.prompt_tokens == len(want[0].prompt_token_ids)
    assert later.choices[0].message.content == texts[1]
    assert blue.choices[0].message.content == texts[2]
    # The image's span: its ids are the vocabulary's size and up.
    ids = want[0].prompt_token_ids
    start = ids.index(VOCAB)
    end = max(i for i, t in enumerate(ids) if t >= VOCAB) + 1
    assert later.usage.prompt_tokens_details.cached_tokens >= end // 128 * 128 > start
    # Another image of the same size: only the text before it can come from the cache.
    assert blue.usage.prompt_tokens_details.cached_tokens <= start


def test_messages_and_responses_images_are_served(served):
    b64 = base64.b64encode(RED).decode()
    with anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0) as a:
        msg = a.messages.create(
            model="v41-tiny", max_tokens=8, thinking=THINKING, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": [
                {"type": "text", "text": TEXT},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": b64}},
                {"type": "text", "text": "What is in the picture?"}]}],
        )  # fmt: skip
    with _client(served) as c:
        resp = c.responses.create(
            model="v41-tiny", max_output_tokens=8, temperature=0,  # (thinking: off by default)
            input=[{"role": "user", "content": [
                {"type": "input_text", "text": TEXT},
                {"type": "input_image", "image_url": _url(RED), "detail": "high"},
                {"type": "input_text", "text": "What is in the picture?"}]}],
        )  # fmt: skip
    # Same content: the same image span (204 tokens for this canvas) in each prompt.
    chat_len = len(_offline([_chat(RED)], 1)[0].prompt_token_ids)
    seen = msg.usage.input_tokens + msg.usage.cache_read_input_tokens  # (Anthropic's split)
    assert abs(seen - chat_len) < 20, (msg.usage, chat_len)
    assert abs(resp.usage.input_tokens - chat_len) < 20, (resp.usage, chat_len)
    assert msg.usage.output_tokens == 8
    assert resp.usage.output_tokens == 8


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(RED)))
        self.end_headers()
        self.wfile.write(RED)

    def log_message(self, *args) -> None:
        pass


def test_image_urls_come_from_allowed_hosts_only_and_bad_images_are_400(served):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]

    def ask(c, url: str):
        return c.chat.completions.create(messages=[{"role": "user", "content": [
            {"type": "text", "text": TEXT}, {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is in the picture?"}]}], max_tokens=6, **KW)  # fmt: skip

    try:
        with _client(served) as c:
            fetched = ask(c, f"http://127.0.0.1:{port}/red.png")
            inline = ask(c, _url(RED))
            # A host that resolves to the same address but is not on the list.
            with pytest.raises(openai.BadRequestError) as e:
                ask(c, f"http://localhost:{port}/red.png")
    finally:
        srv.shutdown()
        srv.server_close()
    assert fetched.choices[0].message.content == inline.choices[0].message.content
    assert fetched.usage.prompt_tokens == inline.usage.prompt_tokens
    assert "fetches images only from its allowed hosts (localhost is not one)" in str(e.value)
    assert e.value.body["code"] == "invalid_image_url"
    with _client(served) as c:
        bad = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot a png").decode()
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": bad}}]}],
                max_tokens=4, **KW)  # fmt: skip
        assert "invalid image" in str(e.value)
    assert served.proc.poll() is None  # nothing crashed


def test_a_killed_decode_worker_is_invisible_to_an_image_stream(served):
    messages = _chat(BLUE, "Describe it at length.")
    want = _offline([messages], 128)[0].text.removeprefix("\n")
    rerouted = served.metric("deepring_requests_rerouted_total")
    started, got = threading.Event(), []

    def stream() -> None:
        with _client(served) as c:
            for ch in c.chat.completions.create(messages=messages, max_tokens=128, stream=True,
                                                **KW):  # fmt: skip
                if ch.choices and ch.choices[0].delta.content:
                    got.append(ch.choices[0].delta.content)
                    if len(got) >= 3:
                        started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(300), "the stream never started"
    deadline, holding = time.monotonic() + 10, []
    while not holding and time.monotonic() < deadline:  # until a load report shows it
        holding = [w["pid"] for w in served.health()["workers"]
                   if w["role"] == "decode" and w["running_requests"]]  # fmt: skip
    os.kill(holding[0], signal.SIGKILL)
    t.join(300)
    assert "".join(got) == want
    assert served.metric("deepring_requests_rerouted_total") > rerouted
    deadline = time.monotonic() + 120  # leave the server whole for whoever comes next
    while time.monotonic() < deadline and served.health()["status"] != "ok":
        time.sleep(0.1)
