"""An image's place in a V4.1 prompt, without torch: what the frontend, the ring and the
engine share about images.

- The span: an image takes `start`, then per row of merged patches `cols` image tokens and a
  newline, then `end` (DeepInfer's layout); its ids are `vocab_size + offset` (DeepInfer's
  ImageTokenOffset), so ids in [vocab, vocab + SPAN_IDS) are image tokens.
- The cache keys: a span's ids say only its shape, so the prefix cache (and the frontend's
  estimate of its hits) keys the span's rows by ids drawn from the image's digest instead, all
  >= 2^31 (token ids are below the vocabulary): a prefix with an image hits only a prefix with
  the same image.
- The wire: a request's images travel from the frontend to the prefill worker, and on to the
  decode worker with the handoff, as the preprocessor's WebP (a few hundred KB at most; the
  decoded pixels would be up to 5 MB): `[start, n_w, n_h, nbytes]` per image in the header and
  the bytes concatenated in one raw frame.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

IMAGE_START, IMAGE_PAD, IMAGE, IMAGE_NEWLINE, IMAGE_END = range(5)  # PAD is never laid out
SPAN_IDS = 5

# The recipe sizes canvases in 14 px patches merged 3 x 3 (deepring_image::fit); a tower with
# other sizes cannot take the recipe's images.
RECIPE_PATCH, RECIPE_MERGE = 14, 3
# The longest canvas side the recipe makes (WebP's 16383 px limit, in whole patches).
MAX_SIDE_PATCHES = 16383 // RECIPE_PATCH
# What a request with images is told when the served model cannot take them.
NO_VISION = "image input is not supported: the served model has no vision encoder"
# The most images one request may carry on the ring (the recipe's quota allows far fewer).
MAX_IMAGES = 256


def merged(n_w: int, n_h: int, merge: int = RECIPE_MERGE) -> tuple[int, int]:
    """(columns, rows) of merged patches of an n_w x n_h patch grid."""
    return -(-n_w // merge), -(-n_h // merge)


def span_ids(vocab: int, cols: int, rows: int) -> list[int]:
    """The token ids of an image span of `rows` rows of `cols` merged patches."""
    row = [vocab + IMAGE] * cols + [vocab + IMAGE_NEWLINE]
    return [vocab + IMAGE_START, *row * rows, vocab + IMAGE_END]


def span_length(n_w: int, n_h: int, merge: int = RECIPE_MERGE) -> int:
    cols, rows = merged(n_w, n_h, merge)
    return rows * (cols + 1) + 2


def webp_size(data: bytes | memoryview) -> tuple[int, int]:
    """(width, height) of a WebP image from its header, without decoding it. ValueError when
    the bytes do not start as a WebP image."""
    b = bytes(data[:30])
    if len(b) < 30 or b[:4] != b"RIFF" or b[8:12] != b"WEBP":
        raise ValueError("not a WebP image")
    chunk = b[12:16]
    if chunk == b"VP8 ":  # lossy: a key frame's start code, then 14-bit sides
        if b[23:26] != b"\x9d\x01\x2a":
            raise ValueError("a WebP image with a malformed VP8 frame header")
        w, h = struct.unpack("<HH", b[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":  # lossless: a signature byte, then 14-bit sides minus one
        if b[20] != 0x2F:
            raise ValueError("a WebP image with a malformed VP8L header")
        bits = int.from_bytes(b[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: 24-bit canvas sides minus one
        return int.from_bytes(b[24:27], "little") + 1, int.from_bytes(b[27:30], "little") + 1
    raise ValueError(f"a WebP image of an unknown kind {chunk!r}")


def encoded_digest(n_w: int, n_h: int, data: bytes | memoryview) -> bytes:
    """The digest of an image that travels encoded: its grid and its bytes (the preprocessor's
    WebP is the same for the same input, so the same image keys the same everywhere)."""
    h = hashlib.blake2b(digest_size=16, person=b"deepring-webp")
    h.update(np.array([n_w, n_h], dtype="<i8").tobytes())
    h.update(data)
    return h.digest()


def key_ids(prompt_ids, spans: Sequence[tuple[int, int, bytes]]) -> list[int]:
    """The prompt with each span, (start, length, digest), replaced by ids from its digest and
    the row's place in it (see above)."""
    out = list(prompt_ids) if not isinstance(prompt_ids, np.ndarray) else prompt_ids.tolist()
    for start, n, digest in spans:
        seed = np.frombuffer(hashlib.blake2b(digest, digest_size=8).digest(), dtype="<u8")[0]
        rows = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + seed
        out[start : start + n] = ((rows >> np.uint64(33)) | np.uint64(1 << 31)).tolist()
    return out


@dataclass(frozen=True)
class EncodedImage:
    """An image as the ring carries it: where its span starts, its patch grid, its WebP."""

    start: int
    n_w: int
    n_h: int
    data: bytes = field(repr=False)

    @property
    def digest(self) -> bytes:
        return encoded_digest(self.n_w, self.n_h, self.data)


def keyed_prompt(prompt_ids, images: Sequence[EncodedImage]) -> list[int]:
    """The prompt as the workers' prefix caches key it (its spans by their images' digests)."""
    spans = [(im.start, span_length(im.n_w, im.n_h), im.digest) for im in images]
    return key_ids(prompt_ids, spans)


def to_wire(images: Sequence[EncodedImage]) -> tuple[list, bytes]:
    """The header list and the raw frame of a request's images."""
    meta = [[im.start, im.n_w, im.n_h, len(im.data)] for im in images]
    return meta, b"".join(im.data for im in images)


def from_wire(meta: list, data) -> list[EncodedImage]:
    """The images of a message's header list and raw frame. ValueError naming what is wrong
    when they do not describe images in prompt order that fill the frame exactly."""
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    if not isinstance(meta, list) or len(meta) > MAX_IMAGES:
        raise ValueError(f"images: a list of at most {MAX_IMAGES} entries expected")
    out, at, end = [], 0, -1
    for k, entry in enumerate(meta):
        if not (isinstance(entry, list) and len(entry) == 4) or not all(
            type(v) is int for v in entry
        ):
            raise ValueError(f"image {k}: [start, n_w, n_h, nbytes] of integers expected")
        start, n_w, n_h, nbytes = entry
        if start <= end or start >= 2**31:
            raise ValueError(f"image {k}: spans must start in prompt order")
        if not (1 <= n_w <= MAX_SIDE_PATCHES and 1 <= n_h <= MAX_SIDE_PATCHES):
            raise ValueError(f"image {k}: a patch grid of {n_w} x {n_h} is out of range")
        if nbytes < 1 or at + nbytes > buf.nbytes:
            raise ValueError(f"image {k}: {nbytes} bytes overrun the image frame")
        out.append(EncodedImage(start, n_w, n_h, bytes(buf[at : at + nbytes])))
        at += nbytes
        end = start
    if at != buf.nbytes:
        raise ValueError(f"the image frame holds {buf.nbytes - at} bytes no image claims")
    return out
