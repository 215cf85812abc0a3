"""Image preprocessing and resolving: deepring_recipe against deepseek-recipe 0.2.0 in one run.

1. Preprocess throughput (images/s) of `OpenCvImagePreprocessor.preprocess` on typical photo
   sizes and formats (JPEG 4032x3024 phone photo, JPEG 1920x1080, PNG 1280x720 screenshot, WebP
   1024x768), high detail, one call at a time from one thread. Target: ours >= 1.5x official.
2. Resolve latency of one 10-image request (`ImageResolver.resolve`: the 10 sizes above as data
   URLs, mixed detail), median and best of `--repeats`.

The images are synthetic photo-like content (tests/recipe/images_support.photo), made once.
Images/s = calls / best wall time of `--repeats` timed loops of at least `--min-seconds` each.

Usage: python bench/images.py [--repeats 3] [--min-seconds 2.0] [--json OUT]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import deepring_recipe as ours
import deepseek_recipe as official
from _machine import describe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "recipe"))
from images_support import photo

TARGET = 1.5
SIZES = [("JPEG", 4032, 3024), ("JPEG", 1920, 1080), ("PNG", 1280, 720), ("WEBP", 1024, 768)]


def rate(f: Callable[[], object], repeats: int, min_seconds: float) -> float:
    best = float("inf")
    per_call = 0.0
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        while True:
            f()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        per_call = elapsed / n
        best = min(best, per_call)
    return 1.0 / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(describe())
    results: dict = {"preprocess": {}, "resolve": {}}
    images = {(fmt, w, h): photo(w, h, fmt, seed=w) for fmt, w, h in SIZES}
    print(f"{'image':<22}{'ours img/s':>12}{'official':>12}{'ratio':>8}")
    for (fmt, w, h), data in images.items():
        row = {}
        for name, lib in (("ours", ours), ("official", official)):
            pre, opts = lib.OpenCvImagePreprocessor(), lib.PreprocessOptions("high", 10_000, 512)
            row[name] = rate(
                lambda pre=pre, opts=opts, data=data: pre.preprocess(data, opts),
                args.repeats,
                args.min_seconds,
            )
        ratio = row["ours"] / row["official"]
        results["preprocess"][f"{fmt} {w}x{h}"] = {**row, "ratio": ratio}
        print(f"{fmt + f' {w}x{h}':<22}{row['ours']:>12.1f}{row['official']:>12.1f}{ratio:>7.2f}x")
    ratios = [r["ratio"] for r in results["preprocess"].values()]
    geo = statistics.geometric_mean(ratios)
    verdict = "met" if geo >= TARGET else "NOT met"
    print(f"geometric mean ratio {geo:.2f}x (target {TARGET}x): {verdict}")

    mime = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp"}
    urls = [
        f"data:image/{mime[k[0]]};base64,{base64.b64encode(v).decode()}" for k, v in images.items()
    ]
    details = ["high", "low", "auto", "high", "low"]
    for name, lib in (("ours", ours), ("official", official)):
        sources = [
            lib.DataUrlImageSource(urls[i % len(urls)], details[i % len(details)])
            for i in range(10)
        ]
        resolver = lib.ImageResolver(lib.ReqwestImageFetcher(), lib.OpenCvImagePreprocessor())
        times = []
        for _ in range(max(3, args.repeats)):
            start = time.perf_counter()
            resolver.resolve(sources, lib.ImageQuota())
            times.append(time.perf_counter() - start)
        results["resolve"][name] = {
            "median_ms": 1e3 * statistics.median(times),
            "best_ms": 1e3 * min(times),
        }
        med, best = 1e3 * statistics.median(times), 1e3 * min(times)
        print(f"resolve 10 images, {name}: median {med:.0f} ms, best {best:.0f} ms")
    results["machine"] = describe()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
