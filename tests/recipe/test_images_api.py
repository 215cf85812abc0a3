"""The drop-in surface: every public name of the official wheel exists here with the same call
signature, and `Tokenizer.from_pretrained` loads local tokenizers without touching the network
(recipe/DEVIATIONS.md, I3)."""

from __future__ import annotations

import inspect
import shutil

import deepring_recipe as ours
import deepseek_recipe as official
import pytest

IMAGE_NAMES = [
    "CalcResizeError",
    "ImageError",
    "ImageInfo",
    "ImageQuota",
    "ImageResolver",
    "MultiModalData",
    "OpenCvImagePreprocessor",
    "PreprocessOptions",
    "ReqwestImageFetcher",
]


def test_every_official_name_exists():
    missing = [n for n in official.__all__ if n not in ours.__all__ or not hasattr(ours, n)]
    assert missing == []


def _signature(obj) -> str | None:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_image_classes_have_the_official_signatures(name):
    a, b = getattr(ours, name), getattr(official, name)
    assert issubclass(a, Exception) == issubclass(b, Exception)
    assert [c.__name__ for c in a.__mro__[1:]] == [c.__name__ for c in b.__mro__[1:]]
    if issubclass(a, Exception):
        return
    assert _signature(a) == _signature(b)
    public = sorted(m for m in dir(b) if not m.startswith("_"))
    assert sorted(m for m in dir(a) if not m.startswith("_")) == public
    for m in public:
        assert _signature(getattr(a, m)) == _signature(getattr(b, m)), m


def test_from_pretrained_reads_files_and_directories(v41_tokenizer_path, tmp_path):
    shutil.copy(v41_tokenizer_path, tmp_path / "tokenizer.json")
    want = ours.Tokenizer.from_file(str(v41_tokenizer_path)).encode("Hello <｜User｜> world")
    for ident in (str(tmp_path), str(tmp_path / "tokenizer.json")):
        assert ours.Tokenizer.from_pretrained(ident).encode("Hello <｜User｜> world") == want


def test_from_pretrained_reads_the_hub_cache(v41_tokenizer_path, tmp_path, monkeypatch):
    repo = tmp_path / "models--deepseek-ai--DeepSeek-V4.1"
    (repo / "snapshots" / "0123abc").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    shutil.copy(v41_tokenizer_path, repo / "snapshots" / "0123abc" / "tokenizer.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    tok = ours.Tokenizer.from_pretrained("deepseek-ai/DeepSeek-V4.1")
    assert tok.encode("hi") == ours.Tokenizer.from_file(str(v41_tokenizer_path)).encode("hi")
    assert (
        ours.Tokenizer.from_pretrained("deepseek-ai/DeepSeek-V4.1", revision="0123abc").vocab_size
        > 0
    )


def test_from_pretrained_never_downloads(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="does not download"):
        ours.Tokenizer.from_pretrained("deepseek-ai/DeepSeek-V4.1")
    with pytest.raises(RuntimeError, match=r"no tokenizer\.json"):
        ours.Tokenizer.from_pretrained(str(tmp_path))
