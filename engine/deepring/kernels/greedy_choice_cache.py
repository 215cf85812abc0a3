"""auto's greedy-head measurement (kernels.greedy_choice), kept per process and on disk.

Every worker process and every engine of a process would otherwise time the heads again at
start (about a second where one head is pathological). The measurement holds for one machine,
torch build, thread count and head shape, which name its file under
DEEPRING_CACHE_DIR/greedy-head/; an unreadable or damaged file is measured again and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from deepring import env
from deepring.kernels.greedy_choice import HeadChoice

log = logging.getLogger("deepring.kernels")
_MEMO: dict[str, HeadChoice] = {}
_FORMAT = 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _key(shape: tuple[int, ...], kinds: tuple[str, ...]) -> str:
    parts = [_FORMAT, _cpu_model(), os.cpu_count(), torch.__version__, torch.get_num_threads(),
             list(shape), list(kinds)]  # fmt: skip
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def _load(path: Path) -> HeadChoice | None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        by_rows = {int(k): str(v) for k, v in d["by_rows"].items()}
        seconds = {k: {int(r): s for r, s in v.items()} for k, v in d["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return HeadChoice(by_rows, seconds)


def _save(path: Path, choice: HeadChoice) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"by_rows": choice.by_rows, "seconds": choice.seconds}))
        tmp.replace(path)  # atomic: another process reads the old file or the new one
    except OSError as e:  # a read-only cache directory: measured again next time
        log.debug("greedy head choice not saved: %s", e)


def cached_choice(
    shape: tuple[int, ...], kinds: tuple[str, ...], measure: Callable[[], HeadChoice]
) -> HeadChoice:
    """The choice for this head shape and candidates: remembered, read from disk, or measured
    (and then written)."""
    key = _key(shape, kinds)
    choice = _MEMO.get(key)
    if choice is not None:
        return choice
    path = env.cache_dir() / "greedy-head" / f"{key}.json"
    choice = _load(path)
    if choice is None or set(choice.by_rows.values()) - set(kinds):
        choice = measure()
        _save(path, choice)
        log.info("greedy head: %s", choice.describe())
    _MEMO[key] = choice
    return choice
