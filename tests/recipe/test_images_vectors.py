"""tests/vectors/images.json (recorded from the official wheel by tools/record_image_vectors.py)
through deepring_recipe's public API: canvas sizes, token counts and errors as recorded, and for
one-colour sources the official's exact WebP bytes. The Rust suite reads the same file
(crates/image/tests/vectors.rs)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import deepring_recipe as M
import pytest

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "images.json"
CASES = json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_recorded_image(case):
    data = base64.b64decode(case["source_b64"])
    options = M.PreprocessOptions(
        case["detail"], case["max_dimension_px"], case["low_detail_max_dimension_px"]
    )
    expect = case["expect"]
    if "error_kind" in expect:
        with pytest.raises(M.ImageError) as err:
            M.OpenCvImagePreprocessor().preprocess(data, options)
        assert (err.value.kind, str(err.value)) == (expect["error_kind"], expect["error"])
        return
    info = M.OpenCvImagePreprocessor().preprocess(data, options)
    assert (info.width, info.height) == (expect["width"], expect["height"])
    assert M.MultiModalData([info]).image_token_adjustment() == expect["token_adjustment"]
    if case["pixel_exact"]:
        assert hashlib.sha256(info.data).hexdigest() == expect["webp_sha256"]
