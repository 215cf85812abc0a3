"""Images in a request's prompt (V4.1): where each image's span sits, its pixels, and the ids
the prefix cache keys the span's rows by.

A span's token ids say only its shape (model.v41.vision.span_ids): two images of one size have
the same ids. The cache keys (Request.key_tokens) therefore replace a span's rows by ids drawn
from the image's digest and the row's place in the span, all >= 2^31 (token ids are below the
vocabulary), so a prefix with an image hits only a prefix with the same image.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from deepring.model.v41.vision import VisionConfig, span_ids


@dataclass(frozen=True)
class PromptImage:
    start: int  # the prompt position of the span's first token (its start token)
    pixels: torch.Tensor = field(repr=False)  # uint8 [height, width, 3], as resized
    n_w: int  # the patch grid the span was sized for
    n_h: int
    # Of the grid and pixels, always computed here: the cache keys rest on it.
    digest: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        px = self.pixels
        if px.dtype != torch.uint8 or px.dim() != 3 or px.shape[2] != 3:
            raise ValueError(f"image pixels must be uint8 [height, width, 3], got "
                             f"{px.dtype} {tuple(px.shape)}")  # fmt: skip
        if min(self.n_w, self.n_h) < 1 or self.start < 0:
            raise ValueError("an image needs a patch grid of at least 1 x 1 and a start >= 0")
        h = hashlib.blake2b(digest_size=16)
        h.update(np.array([self.n_w, self.n_h, px.shape[1], px.shape[0]], dtype="<i8").tobytes())
        h.update(px.contiguous().numpy().tobytes())
        object.__setattr__(self, "digest", h.digest())

    @classmethod
    def of(cls, start: int, pixels, n_w: int, n_h: int) -> PromptImage:
        """From any array of pixels (numpy, torch)."""
        return cls(start, torch.as_tensor(np.asarray(pixels)), n_w, n_h)


def check_images(
    prompt_ids: Sequence[int], images: Sequence[PromptImage], vision: VisionConfig | None,
    vocab: int,
) -> list[int]:  # fmt: skip
    """Each image's span length. ValueError unless each image's span ids sit at its start, the
    spans are in order without overlap, the pixels fit their canvas, and no other prompt id is
    outside the vocabulary."""
    if images and vision is None:
        raise ValueError("this model has no vision tower: it cannot take images")
    end, lengths = 0, []
    covered = np.zeros(len(prompt_ids), dtype=bool)
    for k, im in enumerate(images):
        cols, rows = vision.merged(im.n_w, im.n_h)
        want = span_ids(vocab, cols, rows)
        if im.start < end:
            raise ValueError(f"image {k}'s span starts at {im.start}, inside the one before")
        got = list(prompt_ids[im.start : im.start + len(want)])
        if got != want:
            raise ValueError(
                f"image {k}: the prompt at {im.start} does not hold its span ({len(want)} "
                f"tokens for a {im.n_w} x {im.n_h} patch grid: model.v41.vision.span_ids)"
            )
        p = vision.patch_size
        if im.pixels.shape[0] > im.n_h * p or im.pixels.shape[1] > im.n_w * p:
            raise ValueError(f"image {k} ({im.pixels.shape[1]} x {im.pixels.shape[0]} px) "
                             f"does not fit its {im.n_w * p} x {im.n_h * p} canvas")  # fmt: skip
        end = im.start + len(want)
        covered[im.start : end] = True
        lengths.append(len(want))
    ids = np.asarray(prompt_ids, dtype=np.int64)
    bad = ((ids < 0) | (ids >= vocab)) & ~covered
    if bad.any():
        raise ValueError(f"token ids out of range [0, {vocab}): {ids[bad][:5].tolist()}")
    return lengths


def key_ids(
    prompt_ids: Sequence[int], images: Sequence[PromptImage], lengths: Sequence[int]
) -> list[int]:
    """The prompt with each span (`lengths`: check_images') replaced by ids from its image's
    digest and the row's place in it (see above)."""
    out = list(prompt_ids)
    for im, n in zip(images, lengths, strict=True):
        seed = np.frombuffer(hashlib.blake2b(im.digest, digest_size=8).digest(), dtype="<u8")[0]
        rows = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + seed
        out[im.start : im.start + n] = ((rows >> np.uint64(33)) | np.uint64(1 << 31)).tolist()
    return out
