"""Record tests/vectors/images.json from the official deepseek-recipe 0.2.0 wheel.

Each case: a small source image (base64), the preprocessing options, and what the official
returned: canvas width and height, `image_token_adjustment`, and the SHA-256 of its WebP bytes
(and, for `pixel_exact` cases, the bytes); or the error's kind and message. `pixel_exact`
marks one-colour sources, whose resampling is exact, so our bytes must equal the official's;
for the others only sizes and counts must. Both the Rust suite (crates/image/tests/vectors.rs)
and pytest (tests/recipe/test_images_vectors.py) read the file.

Usage: python tools/record_image_vectors.py   (needs numpy and Pillow, and the official wheel)
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path

import deepseek_recipe as official

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "recipe"))
from images_support import photo, solid  # noqa: E402

CASES = [
    # name, source bytes, detail, max_dimension_px, low_detail_max_dimension_px, pixel_exact
    ("solid-1x1-png-high", solid(1, 1), "high", 10_000, 512, True),
    ("solid-30x20-gif-high", solid(30, 20, "GIF"), "high", 10_000, 512, True),
    ("solid-640x480-png-low", solid(640, 480), "low", 10_000, 512, True),
    ("solid-640x480-png-high", solid(640, 480), "high", 10_000, 512, True),
    ("solid-1x907-png-high", solid(1, 907), "high", 10_000, 512, True),
    ("solid-907x1-png-low", solid(907, 1), "low", 10_000, 512, True),
    ("solid-20x177-png-auto", solid(20, 177), "auto", 10_000, 512, True),
    ("solid-1784x1104-png-high", solid(1784, 1104), "high", 10_000, 512, True),
    ("solid-2000x1000-webp-original", solid(2000, 1000, "WEBP"), "original", 10_000, 512, True),
    ("photo-96x64-png-high", photo(96, 64, "PNG", seed=1), "high", 10_000, 512, False),
    ("photo-160x120-jpeg-low", photo(160, 120, "JPEG", seed=2), "low", 10_000, 100, False),
    ("too-wide-png", solid(10_001, 1), "high", 10_000, 512, False),
    ("small-limit-png", solid(300, 200), "high", 299, 512, False),
    ("garbage", b"not an image at all", "high", 10_000, 512, False),
    ("empty", b"", "high", 10_000, 512, False),
]


def main() -> None:
    cases = []
    for name, data, detail, max_dim, low, exact in CASES:
        case = {
            "name": name,
            "source_b64": base64.b64encode(data).decode(),
            "detail": detail,
            "max_dimension_px": max_dim,
            "low_detail_max_dimension_px": low,
            "pixel_exact": exact,
        }
        try:
            info = official.OpenCvImagePreprocessor().preprocess(
                data, official.PreprocessOptions(detail, max_dim, low)
            )
            case["expect"] = {
                "width": info.width,
                "height": info.height,
                "token_adjustment": official.MultiModalData([info]).image_token_adjustment(),
                "webp_sha256": hashlib.sha256(info.data).hexdigest(),
            }
            if exact:
                case["expect"]["webp_b64"] = base64.b64encode(info.data).decode()
        except official.ImageError as e:
            case["expect"] = {"error_kind": e.kind, "error": str(e)}
        cases.append(case)
    out = ROOT / "tests" / "vectors" / "images.json"
    doc = {"recorded_with": "deepseek-recipe 0.2.0", "cases": cases}
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
