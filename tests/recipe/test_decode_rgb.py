"""deepring_recipe._native.decode_rgb (ours, not the official API): the pixels the engine feeds
the V4.1 vision tower from a preprocessed image, against Pillow's decoding of the same bytes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from deepring_recipe import OpenCvImagePreprocessor, PreprocessOptions
from deepring_recipe._native import decode_rgb
from images_support import photo, pixels
from PIL import Image


def _rgb(data: bytes) -> np.ndarray:
    w, h, raw = decode_rgb(data)
    return np.frombuffer(raw, dtype=np.uint8).reshape(h, w, 3)


@pytest.mark.parametrize("size", [(1, 1), (37, 21), (300, 200)])
def test_lossless_formats_decode_to_their_pixels(size):
    for fmt in ("PNG", "GIF"):
        data = photo(*size, fmt=fmt, seed=sum(size))
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(_rgb(data), want), fmt


def test_a_preprocessed_image_decodes_as_pillow_decodes_it():
    options = PreprocessOptions("high", 10_000, 512)
    info = OpenCvImagePreprocessor().preprocess(photo(500, 333, "JPEG"), options)
    got = _rgb(info.data)
    assert got.shape == (info.height, info.width, 3)
    assert np.array_equal(got.astype(np.int16), pixels(info.data))


def test_bytes_that_are_no_image_are_a_value_error():
    with pytest.raises(ValueError, match="cannot decode"):
        decode_rgb(b"not an image")
    with pytest.raises(ValueError, match="cannot decode"):
        decode_rgb(photo(20, 20)[:40])
