"""A request's images, for a served model with a vision encoder (V4.1): resolved as the official
library resolves them, and laid out in the prompt as the engine reads them.

The recipe renders one `<｜image｜>` placeholder per image and resolves each source (data URL,
base64 block, http(s) URL) to the preprocessed image: a WebP on a canvas of whole 14 px patches
(ImageResolver, with the official's per-request quotas). Each placeholder becomes the image's
span (deepring.image_spans: start, rows of merged patches each ending in a newline, end), and
the WebP travels to the workers with the request.

Image URLs are fetched only when the server was started with an allow-list of hosts
(`--image-url-hosts`); the fetcher then connects only to allowed hosts (redirects included)
whose resolved addresses are public, unless private addresses were allowed as well
(`--image-url-allow-private`, for an image store inside the deployment). Without a list an
image URL is a 400: the server never fetches on a client's behalf by default.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
from deepring_recipe import (
    ImageError,
    ImageQuota,
    ImageResolver,
    ImageSource,
    OpenCvImagePreprocessor,
    ReqwestImageFetcher,
    Tokenizer,
)

from deepring.image_spans import RECIPE_PATCH, EncodedImage, merged, span_ids
from deepring.protocol.errors import ApiError, field_error

PLACEHOLDER = "<｜image｜>"
# A host name, IPv4 address or IPv6 address as urlsplit gives it (no brackets).
_HOST = re.compile(r"[a-z0-9]([a-z0-9.:-]*[a-z0-9])?")


@dataclass(frozen=True)
class UrlPolicy:
    """Which image URLs the server fetches: hosts on the list (an entry `*.example.com` takes
    its subdomains, `*` any host), at public addresses unless allow_private."""

    hosts: tuple[str, ...]
    allow_private: bool = False

    @classmethod
    def parse(cls, hosts: str | Sequence[str] | None, allow_private: bool = False):
        """None when no host is listed (no URL is fetched)."""
        items = hosts.split(",") if isinstance(hosts, str) else list(hosts or ())
        names = tuple(h.strip().lower().rstrip(".") for h in items if h.strip())
        for h in names:
            if h != "*" and not _HOST.fullmatch(h.removeprefix("*.")):
                raise ValueError(f"--image-url-hosts: {h!r} is not a host name or address")
        return cls(names, allow_private) if names else None

    def allows_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for h in self.hosts:
            if h == "*" or h == host or (h.startswith("*.") and host.endswith(h[1:])):
                return True
        return False

    def allows(self, host: str, address: str) -> bool:
        """The fetcher's destination filter: called for the URL's host and every redirect's,
        with each address the name resolved to."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return self.allows_host(host) and (self.allow_private or ip.is_global)


@dataclass(frozen=True)
class ImageSupport:
    """What a Recipe needs to take images: the served vocabulary's size (span ids follow it)
    and the image URLs it may fetch (None: none)."""

    vocab_size: int
    urls: UrlPolicy | None = None


class ImageIntake:
    """Image sources -> the prompt with their spans, and their WebP for the workers."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, urls: UrlPolicy | None = None):
        self.placeholder = tokenizer.token_to_id(PLACEHOLDER)
        if self.placeholder is None:
            raise ValueError(f"the tokenizer has no {PLACEHOLDER} token: it cannot take images")
        self.vocab_size = vocab_size
        self.urls = urls
        fetcher = ReqwestImageFetcher()
        if urls is not None:
            fetcher = fetcher.with_destination_filter(urls.allows)
        self.resolver = ImageResolver(fetcher, OpenCvImagePreprocessor())

    def _check_urls(self, sources: Sequence[ImageSource]) -> None:
        for s in sources:
            url = s.url
            if url is None:
                continue
            where = s.path.lstrip(".") or "image"
            if self.urls is None:
                raise field_error(
                    where,
                    f"{where}: image URLs are not fetched by this server; send the image "
                    "inline (a base64 data URL or base64 source)",
                    "invalid_image_url",
                )
            host = urlsplit(url).hostname or ""
            if not self.urls.allows_host(host):
                raise field_error(
                    where,
                    f"{where}: this server fetches images only from its allowed hosts "
                    f"({host or 'no host'} is not one)",
                    "invalid_image_url",
                )

    def resolve(self, sources: Sequence[ImageSource]) -> list:
        """The preprocessed images (ImageInfo) of a request's sources, in prompt order.
        ApiError: 400 for an image that cannot be served, 502 when fetching it failed in a
        way a retry may mend."""
        self._check_urls(sources)
        try:
            return self.resolver.resolve(list(sources), ImageQuota()).images
        except ImageError as e:
            why = f"invalid image: {e}"
            if e.kind == "DestinationRejected":  # (the library's message does not say so)
                why += (": its host resolves to an address this server does not fetch from "
                        "(private, loopback and link-local addresses are refused)")  # fmt: skip
            raise ApiError(502 if e.is_retryable else 400, why) from None

    def expand(self, prompt_ids, infos: Sequence) -> tuple[np.ndarray, list[EncodedImage]]:
        """The prompt with each placeholder replaced by its image's span (int32), and the
        images as the ring carries them."""
        ids = np.asarray(prompt_ids, dtype=np.int32)
        at = np.flatnonzero(ids == self.placeholder)
        if len(at) != len(infos):
            raise ApiError(400, f"the prompt holds {len(at)} image placeholders for "
                           f"{len(infos)} images")  # fmt: skip
        pieces, images, prev, shift = [], [], 0, 0
        for pos, info in zip(at.tolist(), infos, strict=True):
            w, h = info.width, info.height
            if w % RECIPE_PATCH or h % RECIPE_PATCH or not (w and h):
                raise ApiError(500, f"a preprocessed image's canvas ({w} x {h} px) is not "
                               "whole patches")  # fmt: skip
            n_w, n_h = w // RECIPE_PATCH, h // RECIPE_PATCH
            span = np.asarray(span_ids(self.vocab_size, *merged(n_w, n_h)), np.int32)
            pieces += [ids[prev:pos], span]
            images.append(EncodedImage(pos + shift, n_w, n_h, bytes(info.data)))
            shift += len(span) - 1
            prev = pos + 1
        pieces.append(ids[prev:])
        return np.concatenate(pieces), images
