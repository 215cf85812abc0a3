"""V4.1 image requests through the worker roles, every message through the codec: the prefill
worker decodes the Submit's WebP and runs the tower, the Handoff carries the WebP on, and a
decode worker short of blocks preempts a request and recomputes it with its image; the output
is offline decoding's (LLM.generate, one process). A Submit whose image frame is malformed or
holds no image comes back as that request's error, and the worker goes on."""

from __future__ import annotations

import base64
import dataclasses
import io

import numpy as np
import pytest
from deepring import LLM, SamplingParams
from deepring.config import EngineSpec
from deepring.image_spans import to_wire
from PIL import Image
from test_worker_roles import Stream, _pipeline, _run, _submit, _wire

SPEC = EngineSpec(model="v41-tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=96)
# Room for the two prompts' blocks and one more: both grow past it while decoding.
SMALL = dataclasses.replace(SPEC, num_blocks=6)
THINKING = {"type": "disabled"}


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (30, 70, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _body(seed: int) -> dict:
    url = "data:image/png;base64," + base64.b64encode(_png(seed)).decode()
    return {"model": "v41-tiny", "thinking": THINKING, "messages": [{"role": "user", "content": [
        {"type": "text", "text": f"picture {seed}:"},
        {"type": "image_url", "image_url": {"url": url}}]}]}  # fmt: skip


def _with_images(msg, images):
    meta, data = to_wire(images)
    return _wire(dataclasses.replace(msg, images=meta, image_data=data))


@pytest.fixture(scope="module")
def llm(deepring_cache_dir):
    return LLM("v41-tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=96)


def test_image_requests_survive_handoff_and_a_recompute_at_decode(llm):
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    bodies = [_body(s) for s in (1, 2)]
    want = [o.token_ids for o in llm.generate(bodies, params)]
    link, pre, dec = _pipeline(SPEC, SMALL)
    for rid, body in enumerate(bodies):
        enc = llm._encode(body)
        assert len(enc.prompt_ids) > 128  # two blocks each, growing to three
        pre.handle(_with_images(_submit(rid, enc.prompt_ids, params), enc.images))
    stream, handed = Stream(), []
    receive = dec.handle
    dec.handle = lambda h, link=0: (handed.append(h), receive(h, link))[1]  # (counts them)
    _run(link, pre, dec, stream, steps=2000)
    assert [(len(h.images), len(h.image_data) > 0) for h in handed] == [(1, True)] * 2
    assert dec.engine.scheduler.num_preemptions > 0, "a request should have been recomputed"
    assert not stream.errors
    assert [stream.ids(r) for r in range(2)] == want
    assert dec.engine.blocks.num_used == 0


def test_bad_image_frames_are_that_requests_error(llm):
    link, pre, _ = _pipeline(SPEC, SPEC)
    enc = llm._encode(_body(3))
    params = SamplingParams(temperature=0, max_tokens=2)
    (im,) = enc.images
    cases = {
        0: dataclasses.replace(im, data=b"RIFF\0\0\0\0WEBPVP8L" + b"\0" * 40),  # no image
        1: dataclasses.replace(im, start=im.start + 1),  # not where its span is
        2: dataclasses.replace(im, n_w=im.n_w + 3),  # a grid its span does not have
    }
    for rid, bad in cases.items():
        pre.handle(_with_images(_submit(rid, enc.prompt_ids, params), [bad]))
    msg = dataclasses.replace(_submit(3, enc.prompt_ids, params), images=[[im.start, im.n_w,
                              im.n_h, len(im.data) + 5]], image_data=im.data)  # fmt: skip
    pre.handle(_wire(msg))
    stream = Stream()
    stream.feed(link.take()[0])
    assert sorted(stream.errors) == [0, 1, 2, 3]
    assert all("the request was rejected" in e for e in stream.errors.values())
    assert "overrun" in stream.errors[3]
    # The worker goes on: the good image's request is served.
    pre.handle(_with_images(_submit(9, enc.prompt_ids, params), [im]))
    for _ in range(10):  # (a prefill of 96-token steps)
        pre.step()
        stream.feed(link.take()[0])
    assert stream.ids(9) == llm.generate(_body(3), params)[0].token_ids[:1]
