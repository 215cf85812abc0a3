"""Images in a request's prompt (V4.1): where each image's span sits, its pixels, and the ids
the prefix cache keys the span's rows by (deepring.image_spans: a span's ids say only its
shape, so the cache keys its rows by the image's digest).

An image comes either as pixels (EngineCore.add's callers) or as the WebP the request's
preprocessor made (serving: the frontend resolves the image, the ring carries the WebP). An
encoded image is decoded when the vision tower needs it and its pixels are not kept: the
decode worker keeps only the WebP of a request it may have to recompute.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from deepring.image_spans import NO_VISION, EncodedImage, encoded_digest, span_ids, webp_size
from deepring.image_spans import key_ids as _key_ids
from deepring.model.v41.vision import VisionConfig

if TYPE_CHECKING:
    from deepring.core.request import Request


@dataclass(frozen=True)
class PromptImage:
    start: int  # the prompt position of the span's first token (its start token)
    # uint8 [height, width, 3], as resized; None for an encoded image not decoded yet.
    pixels: torch.Tensor | None = field(repr=False)
    n_w: int  # the patch grid the span was sized for
    n_h: int
    encoded: bytes | None = field(default=None, repr=False)  # the WebP the pixels come from
    # Always computed here: the cache keys rest on the digest (of the WebP when there is one,
    # so that every worker keys a served image alike, else of the grid and pixels).
    digest: bytes = field(init=False, repr=False)
    size: tuple[int, int] = field(init=False)  # (width, height) in pixels

    def __post_init__(self) -> None:
        if min(self.n_w, self.n_h) < 1 or self.start < 0:
            raise ValueError("an image needs a patch grid of at least 1 x 1 and a start >= 0")
        px = self.pixels
        if px is not None:
            if px.dtype != torch.uint8 or px.dim() != 3 or px.shape[2] != 3:
                raise ValueError(f"image pixels must be uint8 [height, width, 3], got "
                                 f"{px.dtype} {tuple(px.shape)}")  # fmt: skip
            size = (int(px.shape[1]), int(px.shape[0]))
        elif self.encoded is None:
            raise ValueError("an image needs its pixels or its encoded bytes")
        else:
            size = webp_size(self.encoded)
        if self.encoded is not None:
            digest = encoded_digest(self.n_w, self.n_h, self.encoded)
        else:
            h = hashlib.blake2b(digest_size=16)
            h.update(np.array([self.n_w, self.n_h, *size], dtype="<i8").tobytes())
            h.update(px.contiguous().numpy().tobytes())
            digest = h.digest()
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "size", size)

    @classmethod
    def of(cls, start: int, pixels, n_w: int, n_h: int) -> PromptImage:
        """From any array of pixels (numpy, torch)."""
        return cls(start, torch.as_tensor(np.asarray(pixels)), n_w, n_h)

    @classmethod
    def from_encoded(cls, image: EncodedImage, decode: bool = False) -> PromptImage:
        """From the ring's form. decode: decode it now (ValueError for bytes that are not an
        image of the size their header says) and keep the pixels until the tower has run."""
        im = cls(image.start, None, image.n_w, image.n_h, encoded=image.data)
        if decode:
            object.__setattr__(im, "pixels", im.rgb())
        return im

    def rgb(self) -> torch.Tensor:
        """The pixels, decoded from the WebP when not at hand. ValueError when it does not
        decode to the size its header says."""
        if self.pixels is not None:
            return self.pixels
        from deepring_recipe._native import decode_rgb

        w, h, data = decode_rgb(self.encoded)
        if (w, h) != self.size:
            raise ValueError(f"an image decoded to {w} x {h} px, its header says {self.size}")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(h, w, 3)

    def without_pixels(self) -> PromptImage:
        """The same image holding only its WebP (itself when it has none to decode from)."""
        if self.encoded is None or self.pixels is None:
            return self
        return PromptImage(self.start, None, self.n_w, self.n_h, encoded=self.encoded)

    def wire(self) -> EncodedImage:
        if self.encoded is None:
            raise ValueError("an image given as pixels cannot travel on the ring")
        return EncodedImage(self.start, self.n_w, self.n_h, self.encoded)


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
        width, height = im.size
        if height > im.n_h * p or width > im.n_w * p:
            raise ValueError(f"image {k} ({width} x {height} px) "
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
    digest (deepring.image_spans.key_ids)."""
    spans = [(im.start, n, im.digest) for im, n in zip(images, lengths, strict=True)]
    return _key_ids(prompt_ids, spans)


def attach_images(req: Request, images: Sequence[PromptImage], lengths: list[int]) -> None:
    """A request's images, their spans and its prompt as the prefix cache keys it."""
    if images:
        req.images = tuple(images)
        req.image_spans = [(im.start, im.start + n) for im, n in zip(images, lengths, strict=True)]
        req.key_prompt = key_ids(req.prompt_ids, images, lengths)


def image_support(model) -> dict | str:
    """Whether an engine running `model` takes images: the sizes their spans are laid out
    with, or why it takes none (what the frontend answers an image with)."""
    vision = getattr(model, "vision_config", None)
    if vision is None:
        return NO_VISION
    if not vision.recipe_sized():
        return (
            f"image input is not supported: the model's vision encoder takes "
            f"{vision.patch_size} px patches merged "
            f"{vision.downsample_ratio} x {vision.downsample_ratio}, and requests' images are "
            "sized for 14 px patches merged 3 x 3"
        )
    return {"patch_size": vision.patch_size, "downsample_ratio": vision.downsample_ratio}
