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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
