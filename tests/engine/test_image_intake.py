"""Images on their way in (protocol.images, deepring.image_spans): the recipe's placeholders laid
out as spans, the WebP header read without decoding (against the decoder), the ring's image
frames and what a malformed one is refused for, the frontend's cache keys against the workers',
and image URLs: refused without an allow-list, fetched from an allowed host at an allowed
address only (a 127.0.0.1 server the test starts)."""

from __future__ import annotations

import base64
import http.server
import io
import json
import threading

import numpy as np
import pytest
import torch
from deepring.core.images import PromptImage, key_ids
from deepring.image_spans import (
    EncodedImage,
    from_wire,
    keyed_prompt,
    span_ids,
    span_length,
    to_wire,
    webp_size,
)
from deepring.protocol.errors import ApiError
from deepring.protocol.formats import PromptFormat
from deepring.protocol.images import ImageSupport, UrlPolicy
from deepring.protocol.prepare import CHAT, Recipe
from deepring_recipe import ImageQuota, ImageResolver, OpenCvImagePreprocessor, ReqwestImageFetcher
from deepring_recipe._native import decode_rgb
from PIL import Image

VOCAB = 129281


def _png(size=(90, 40), seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    im = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def _body(*images: bytes | str) -> dict:
    parts = [{"type": "text", "text": "look:"}]
    for im in images:
        url = (
            im if isinstance(im, str) else "data:image/png;base64," + base64.b64encode(im).decode()
        )
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"model": "m", "messages": [{"role": "user", "content": parts}],
            "thinking": {"type": "disabled"}}  # fmt: skip


@pytest.fixture(scope="module")
def recipe(v41_tokenizer_path):
    return Recipe(v41_tokenizer_path, ["m"], PromptFormat.V41, images=ImageSupport(VOCAB))


def test_placeholders_become_spans_of_the_preprocessed_canvas(recipe):
    a, b = _png((90, 40), 1), _png((700, 300), 2)
    plain = recipe.encode(CHAT, _body(a, b))  # one placeholder per image, not laid out
    ph = recipe.tokenizer.token_to_id("<｜image｜>")
    assert plain.count(ph) == 2
    out = recipe.encode_offline(CHAT, _body(a, b))
    infos = ImageResolver(ReqwestImageFetcher(), OpenCvImagePreprocessor()).resolve(
        [s for s in recipe.encoding.render_conversation(
            recipe._convert(CHAT, _body(a, b)).conv.conversation).image_sources],
        ImageQuota()).images  # fmt: skip
    ids, at = list(out.prompt_ids), [i for i, t in enumerate(plain) if t == ph]
    shift = 0
    for k, (info, im) in enumerate(zip(infos, out.images, strict=True)):
        n_w, n_h = info.width // 14, info.height // 14
        assert (im.start, im.n_w, im.n_h, im.data) == (at[k] + shift, n_w, n_h, info.data)
        span = span_ids(VOCAB, -(-n_w // 3), -(-n_h // 3))
        assert ids[im.start : im.start + len(span)] == span
        shift += len(span) - 1
    # Everything else is the plain prompt, in order.
    rest = [t for t in ids if t < VOCAB]
    assert rest == [t for t in plain if t != ph]


def test_the_output_limit_is_resolved_for_the_laid_out_prompt(recipe):
    im = _png((90, 40))
    prep = recipe.prepare(CHAT, json.dumps(_body(im)), max_model_len=400)
    assert prep.pending is not None  # one placeholder until resolved
    done = recipe.resolve_images(prep)
    assert done.pending is None
    (laid,) = done.images
    assert len(done.prompt_ids) == len(prep.prompt_ids) + span_length(laid.n_w, laid.n_h) - 1
    assert done.params.max_tokens == 400 - len(done.prompt_ids)
    n = len(done.prompt_ids)  # a context it fills leaves no room for output
    with pytest.raises(ApiError, match=f"maximum context length is {n} tokens"):
        recipe.resolve_images(recipe.prepare(CHAT, json.dumps(_body(im)), max_model_len=n))


def test_webp_size_matches_the_decoder():
    rng = np.random.default_rng(3)
    px = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    made = []
    alpha = np.concatenate([px, px[..., :1]], axis=2)  # lossy with alpha: the VP8X kind
    for arr, kw in ((px, {"lossless": True}), (px, {"quality": 80}), (alpha, {"quality": 80})):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "WEBP", **kw)
        made.append(buf.getvalue())
    made.append(OpenCvImagePreprocessor().preprocess(_png((300, 120)), _options()).data)
    kinds = {m[12:16] for m in made}
    assert kinds == {b"VP8L", b"VP8 ", b"VP8X"}  # every header kind
    for data in made:
        w, h, _ = decode_rgb(data)
        assert webp_size(data) == (w, h)
    for bad in (b"", b"RIFF\0\0\0\0WEBPVP8 ", _png(), made[1][:20] + b"\0" * 12):
        with pytest.raises(ValueError, match="WebP"):
            webp_size(bad)


def _options():
    from deepring_recipe import PreprocessOptions

    return PreprocessOptions("high", 4096, 512)


def test_ring_frames_round_trip_and_malformed_ones_are_refused():
    ims = [EncodedImage(3, 10, 7, b"abc"), EncodedImage(400, 1, 1, b"d" * 9)]
    meta, data = to_wire(ims)
    assert from_wire(meta, data) == ims
    assert from_wire(meta, memoryview(data)) == ims
    assert from_wire([], b"") == []
    bad = [
        ([[3, 10, 7, 3], [3, 1, 1, 9]], data, "prompt order"),
        ([[3, 10, 7, 3]], data, "no image claims"),
        ([[3, 10, 7, 30]], data, "overrun"),
        ([[3, 0, 7, 3]], b"abc", "out of range"),
        ([[3, 10, 7, 0]], b"", "overrun"),
        ([[3, 10, 7]], b"abc", "integers"),
        ([[3, 10, 7, True]], b"abc", "integers"),
        ({"a": 1}, b"", "list"),
        ([[-1, 1, 1, 3]], b"abc", "prompt order"),
    ]
    for meta, data, why in bad:
        with pytest.raises(ValueError, match=why):
            from_wire(meta, data)


def test_the_frontend_keys_a_span_as_the_workers_cache_does():
    data = OpenCvImagePreprocessor().preprocess(_png((300, 120)), _options()).data
    n_w, n_h = 22, 9
    n = span_length(n_w, n_h)
    prompt = [5, 6, 7, *span_ids(VOCAB, -(-n_w // 3), -(-n_h // 3)), 8]
    enc = EncodedImage(3, n_w, n_h, data)
    worker = PromptImage.from_encoded(enc)
    assert keyed_prompt(prompt, [enc]) == key_ids(prompt, [worker], [n])
    # The decoded pixels are the WebP's; the same pixels given directly key alike only by
    # their own digest (a different one), and another image's WebP keys differently.
    assert torch.equal(worker.rgb(), PromptImage.from_encoded(enc, decode=True).pixels)
    other = OpenCvImagePreprocessor().preprocess(_png((300, 120), 9), _options()).data
    assert keyed_prompt(prompt, [EncodedImage(3, n_w, n_h, other)]) != keyed_prompt(prompt, [enc])
    assert keyed_prompt(prompt, [enc])[:3] == [5, 6, 7]
    assert all(k >= 2**31 for k in keyed_prompt(prompt, [enc])[3 : 3 + n])


def test_url_policy():
    assert UrlPolicy.parse(None) is None
    assert UrlPolicy.parse(" , ") is None
    p = UrlPolicy.parse("images.example.com, *.cdn.example.org")
    assert p.allows_host("images.example.com")
    assert p.allows_host("a.b.cdn.example.org")
    assert not p.allows_host("cdn.example.org.evil.com")
    assert not p.allows_host("example.com")
    assert p.allows("images.example.com", "93.184.216.34")
    for private in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1",
                    "::ffff:127.0.0.1", "fe80::1", "0.0.0.0", "not an address"):  # fmt: skip
        assert not p.allows("images.example.com", private), private
    assert not p.allows("other.example.com", "93.184.216.34")
    assert UrlPolicy.parse("*", allow_private=True).allows("x", "10.0.0.1")
    with pytest.raises(ValueError, match="not a host name"):
        UrlPolicy.parse("http://x.com/")


class _Images(http.server.BaseHTTPRequestHandler):
    png = _png((64, 64), 5)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(self.png)))
        self.end_headers()
        self.wfile.write(self.png)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def image_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/a.png"
    finally:
        srv.shutdown()
        srv.server_close()


def _refused(recipe: Recipe, body: dict) -> ApiError:
    with pytest.raises(ApiError) as e:
        recipe.encode_offline(CHAT, body)
    return e.value


def test_image_urls_are_fetched_only_from_allowed_hosts_at_allowed_addresses(
    v41_tokenizer_path, recipe, image_server
):
    def with_urls(hosts, private=False):
        urls = UrlPolicy.parse(hosts, private)
        return Recipe(v41_tokenizer_path, ["m"], PromptFormat.V41,
                      images=ImageSupport(VOCAB, urls))  # fmt: skip

    body = _body(image_server)
    e = _refused(recipe, body)  # no allow-list: nothing fetched
    assert "image URLs are not fetched by this server" in e.message
    assert json.loads(e.body("/v1/chat/completions"))["error"]["code"] == "invalid_image_url"
    e = _refused(with_urls("images.example.com"), body)
    assert "allowed hosts (127.0.0.1 is not one)" in e.message
    e = _refused(with_urls("127.0.0.1"), body)  # listed, but a loopback address
    assert e.status == 400
    assert "resolves to an address this server does not fetch from" in e.message
    got = with_urls("127.0.0.1", private=True).encode_offline(CHAT, body)
    inline = recipe.encode_offline(CHAT, _body(_Images.png))
    assert got.prompt_ids == inline.prompt_ids
    assert [im.data for im in got.images] == [im.data for im in inline.images]


def test_a_text_only_model_refuses_images_naming_why(v41_tokenizer_path):
    why = "image input is not supported: the served model has no vision encoder"
    text = Recipe(v41_tokenizer_path, ["m"], PromptFormat.V41, images=why)
    e = _refused(text, _body(_png()))
    assert e.message == f"messages[0].content[1]: {why}"


def test_a_chat_file_part_with_image_data_is_an_image_where_images_are_served(recipe):
    png = _png((90, 40), 4)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    as_file = _body()
    as_file["messages"][0]["content"].append({"type": "file", "file_data": url})
    got = recipe.encode_offline(CHAT, as_file)
    want = recipe.encode_offline(CHAT, _body(png))
    assert got.prompt_ids == want.prompt_ids
    assert [im.data for im in got.images] == [im.data for im in want.images]
    other = _body()
    other["messages"][0]["content"].append({"type": "file", "file_id": "file-1"})
    assert "file_id is not supported" in _refused(recipe, other).message


def test_a_text_only_model_refuses_file_parts_naming_why(v41_tokenizer_path):
    text = Recipe(v41_tokenizer_path, ["m"], PromptFormat.V41)
    body = _body()
    body["messages"][0]["content"].append({"type": "file", "file_data": "data:image/png;base64,"})
    assert "file input is not supported" in _refused(text, body).message
