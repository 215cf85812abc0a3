"""Image specs (valid, or broken by the fault "image") and their URLs."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import strategies as st

from .context import Ctx

PNG_HEADER = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
ODD_BASE64 = ["@@", "iVBO Rw0K\nGgo=", "-_-_", "", "====", PNG_HEADER + "="]


def base64_payload(ctx: Ctx) -> str:
    data = base64.b64encode(ctx.draw(st.binary(max_size=12))).decode() or PNG_HEADER
    if ctx.chance(5):
        return data.rstrip("=") or "QQ"  # unpadded: accepted or not, both must agree
    return data


def image_spec(ctx: Ctx) -> dict:
    kinds = ["data", "http", "https"]
    if ctx.fault("image", 70):
        kinds = ["bad_b64", "bad_mime", "percent", "ftp", "garbage", "file_id", "odd_b64"]
    kind = ctx.pick(kinds)
    spec: dict[str, Any] = {"kind": kind}
    if kind in ("data", "bad_b64", "odd_b64"):
        spec["mime"] = ctx.pick(["image/png", "image/jpeg", "image/gif", "image/webp"])
        spec["data"] = {"data": base64_payload(ctx), "bad_b64": "@@"}.get(kind) or ctx.pick(
            ODD_BASE64
        )
    elif kind == "bad_mime":
        spec["mime"] = ctx.pick(["text/plain", "application/pdf", "image/bmp"])
        spec["data"] = "aGk="
    if ctx.chance(50):
        spec["detail"] = ctx.pick_faulty(
            "image", ["low", "high", "auto", "original"], ["weird"], 20
        )
    return spec


def image_url_of(spec: dict) -> str:
    kind = spec["kind"]
    if "data" in spec:
        return f"data:{spec['mime']};base64,{spec['data']}"
    return {
        "http": "http://example.com/a.png",
        "https": "https://example.com/日本/a.png?x=1&y=%20",
        "percent": "data:image/png,abc%20",
        "ftp": "ftp://example.com/a.png",
        "garbage": "notaurl",
        "file_id": "file-abc",
    }[kind]
