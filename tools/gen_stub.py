"""Generate recipe/deepring_recipe/_native.pyi from the built `deepring_recipe._native` module.

Usage (from the repository root, with the native module built into .venv):

    python tools/gen_stub.py            # rewrite the stub (also: ./dev stub)
    python tools/gen_stub.py --check    # exit 1 with a diff when the committed stub is stale
    python tools/gen_stub.py --stdout   # print the stub instead of writing it

This script is the command line; the generator is the package tools/stubgen/: `generator`
(what comes from the runtime), `tables` (the annotations), `docs` (hand-written docstrings)
and `helpers`.

The output is formatted with `ruff format` (pinned in requirements/dev.txt) so that
`ruff format --check` agrees with it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import subprocess
import sys
from pathlib import Path

from stubgen.generator import MODULE, Generator

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "recipe" / "deepring_recipe" / "_native.pyi"


def _ruff_format(text: str) -> str:
    cmd = [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(STUB), "-"]
    try:
        done = subprocess.run(cmd, input=text, capture_output=True, text=True, cwd=ROOT)
    except OSError as e:
        msg = f"gen_stub: cannot run ruff ({e}); pip install -r requirements/dev.txt"
        raise SystemExit(msg) from e
    if done.returncode != 0:
        sys.stderr.write(text)
        raise SystemExit(f"gen_stub: ruff format failed:\n{done.stderr}")
    return done.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail if the committed stub is stale")
    mode.add_argument("--stdout", action="store_true", help="print the stub, write nothing")
    args = ap.parse_args()

    gen = Generator(importlib.import_module(MODULE))
    text = _ruff_format(gen.generate())
    if gen.fallbacks:
        print(
            f"gen_stub: {len(gen.fallbacks)} annotation(s) not in the tables, typed Any: "
            + ", ".join(gen.fallbacks),
            file=sys.stderr,
        )
    rel = STUB.relative_to(ROOT)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    current = STUB.read_text() if STUB.exists() else ""
    if args.check:
        if current == text:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            text.splitlines(keepends=True),
            f"{rel} (current)",
            f"{rel} (generated from the built module)",
        )
        sys.stderr.writelines(diff)
        print(
            f"gen_stub: {rel} is stale; regenerate it with `./dev stub` "
            "(python tools/gen_stub.py) and commit the result",
            file=sys.stderr,
        )
        return 1
    if current == text:
        print(f"gen_stub: {rel} is up to date", file=sys.stderr)
    else:
        STUB.write_text(text)
        print(f"gen_stub: wrote {rel}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
