"""Requests with images in all three protocols, end to end against the official wheel: the
image inputs of Chat Completions (data URLs, http URLs), Messages (base64 blocks, URLs) and
Responses (data URLs, URLs) -> conversion -> V4.1 prompt and token ids -> resolved images ->
canvas sizes and `image_token_adjustment`, and so the number of tokens the model is fed.

URLs point at a 127.0.0.1 server the test starts; the fetcher has no filter (as the official's
default), so it may connect there.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import deepring_recipe as ours
import deepseek_recipe as official
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from images_support import outcome, photo, server, solid

MODEL = "DeepSeek-V4.1-Flash"


@pytest.fixture(scope="module")
def tokenizers(v41_tokenizer_path):
    return {lib: lib.Tokenizer.from_file(str(v41_tokenizer_path)) for lib in (ours, official)}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bodies(base: str) -> dict[str, dict]:
    png = _b64(photo(400, 300, "PNG", seed=3))
    jpeg = _b64(photo(1600, 900, "JPEG", seed=4))
    tall = _b64(solid(3, 2000, "WEBP"))
    gif = _b64(solid(64, 48, "GIF"))
    return {
        "chat": {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Compare these"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{png}", "detail": "low"},
                        },
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/jpeg;base64,{jpeg}"},
                        },
                        {"type": "image_url", "image_url": {"url": f"{base}/png"}},
                        {"type": "text", "text": "and this one"},
                        {
                            "type": "image_url",
                            "image_url": {
                                "url": f"data:image/webp;base64,{tall}",
                                "detail": "high",
                            },
                        },
                    ],
                },
            ],
        },
        "messages": {
            "model": MODEL,
            "max_tokens": 64,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/gif", "data": gif},
                        },
                        {"type": "text", "text": "What is in the picture?"},
                        {
                            "type": "image",
                            "source": {"type": "url", "url": f"{base}/png?ct=text/html"},
                        },
                    ],
                }
            ],
        },
        "responses": {
            "model": MODEL,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Describe"},
                        {
                            "type": "input_image",
                            "image_url": f"data:image/jpeg;base64,{jpeg}",
                            "detail": "low",
                        },
                        {"type": "input_image", "image_url": f"{base}/png", "detail": "auto"},
                    ],
                }
            ],
        },
    }


REQUESTS = {
    "chat": "ChatCompletionRequest",
    "messages": "MessagesRequest",
    "responses": "ResponsesRequest",
}


def _run(lib, tok, protocol: str, body: dict):
    req = getattr(lib, REQUESTS[protocol])(body).convert(lib.ConversionOptions())
    enc = lib.DeepseekV41Encoding().with_tokenizer(tok)
    rendered = enc.render_conversation(req.conversation)
    ids = enc.encode(req.conversation)
    quota = lib.ImageQuota()
    resolver = lib.ImageResolver(lib.ReqwestImageFetcher(), lib.OpenCvImagePreprocessor())
    mm = resolver.resolve(rendered.image_sources, quota)
    adj = mm.image_token_adjustment()
    return {
        "prompt": rendered.prompt,
        "ids": ids,
        "sources": [(s.kind, s.detail, s.path) for s in rendered.image_sources],
        "canvases": [(i.width, i.height) for i in mm.images],
        "adjustment": adj,
        "model_tokens": len(ids) + adj,
        "quota": (quota.image_count(), quota.byte_size()),
    }


@pytest.mark.parametrize("protocol", sorted(REQUESTS))
def test_request_images_match(protocol, tokenizers):
    with server() as base:
        body = _bodies(base)[protocol]
        got = _run(ours, tokenizers[ours], protocol, body)
        want = _run(official, tokenizers[official], protocol, body)
    assert got["sources"]
    assert got == want


def test_failed_image_reports_its_request_location(tokenizers):
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "x"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + _b64(b"not an image")},
                    },
                ],
            },
        ],
    }

    def run(lib):
        conv = lib.ChatCompletionRequest(body).convert(lib.ConversionOptions()).conversation
        rendered = lib.DeepseekV41Encoding().render_conversation(conv)
        resolver = lib.ImageResolver(lib.ReqwestImageFetcher(), lib.OpenCvImagePreprocessor())
        return outcome(lambda: resolver.resolve(rendered.image_sources, lib.ImageQuota()))

    got, want = run(ours), run(official)
    assert got == want
    assert "messages[2]" in got[3]
