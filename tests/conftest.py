"""Shared pytest fixtures: the V4.1 tokenizer, the recorded vectors, GPU gating."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
ROOT = TESTS.parent
VECTORS = TESTS / "vectors"
sys.path.insert(0, str(TESTS / "fixtures"))

from v41_tokenizer import write_fixture  # noqa: E402


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Tests that must have the machine to themselves (`./dev test` runs every other test two at a
# time, pytest-xdist): every e2e test (whole servers of several processes, killed and frozen
# workers, heartbeat deadlines), and the engine tests that start worker processes or time
# what they observe (timeouts, slow clients, heartbeats, collectives between ranks).
SERIAL_DIRS = ("e2e",)
SERIAL_FILES = {
    "test_ring_serving.py", "test_ring_hostile.py", "test_http_hostile.py",
    "test_kv_store_redis.py", "test_frontend_heartbeats.py", "test_ep_moe.py",
    "test_kernels_numba_threads.py", "test_cli.py",
}  # fmt: skip


def _serial(item: pytest.Item) -> bool:
    path = item.path.relative_to(TESTS)
    return path.parts[0] in SERIAL_DIRS or path.name in SERIAL_FILES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _serial(item):
            item.add_marker(pytest.mark.serial)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def v41_tokenizer_path() -> Path:
    default = ROOT / "target" / "test-fixtures" / "deepseek-v41-tokenizer.json"
    return write_fixture(Path(os.environ.get("DEEPRING_TEST_TOKENIZER", default)))


def load_vectors(name: str) -> dict:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def request_vectors() -> dict:
    return load_vectors("recipe-requests.json")


@pytest.fixture(scope="session")
def stream_vectors() -> dict:
    return load_vectors("recipe-streams.json")
