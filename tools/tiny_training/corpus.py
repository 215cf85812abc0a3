"""The corpus: the Python standard library's own .py sources, which ship with every Python.

Files are split into training and held-out sets by a hash of their path relative to the
standard library (so the split does not depend on which other files a Python version has).
Test suites, IDLE, lib2to3, turtledemo and site-packages are left out: the tests are half of the
library and mostly boilerplate, the others are applications rather than library code. So are
the codecs (encodings/) and html/entities.py: their hex tables are an eighth of the rest, and a
first model trained with them answered every prompt with "0x00c,    0x00c, ...". Every file
becomes <bos> + its tokens + <eos>; training sequences are fixed-length windows cut from the
concatenation, so a window may run from one file into the next (the <eos> <bos> marks the seam,
and the model learns to end a file).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

SKIP_PARTS = {
    "site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "__pycache__",
    "encodings",
}  # fmt: skip
SKIP_FILES = {"html/entities.py"}
HELD_OUT_MOD = 20  # one file in 20 is held out


@dataclass
class Corpus:
    train: torch.Tensor  # int64 [N] the training files' tokens, concatenated
    held_out: list[torch.Tensor]  # one int64 tensor per held-out file
    held_out_names: list[str]
    vocab: torch.Tensor  # int64 [V_train] the tokens of the LM head, most frequent first
    files: int
    python: str


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path]]:
    root = root or Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if not SKIP_PARTS.intersection(rel.parts) and rel.as_posix() not in SKIP_FILES:
            out.append((rel.as_posix(), f))
    return out


def is_held_out(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % HELD_OUT_MOD == 0


def load(tokenizer_json: Path, bos: int, eos: int, min_count: int = 2) -> Corpus:
    """Tokenize the library; the vocabulary is every token seen at least `min_count` times in
    the training files, most frequent first (ties by id)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    files = stdlib_files()
    texts = [f.read_text(encoding="utf-8", errors="replace") for _, f in files]
    encs = tok.encode_batch(texts, add_special_tokens=False)
    train, held, names = [], [], []
    for (rel, _), enc in zip(files, encs, strict=True):
        ids = torch.tensor([bos, *enc.ids, eos], dtype=torch.long)
        if is_held_out(rel):
            held.append(ids)
            names.append(rel)
        else:
            train.append(ids)
    train_ids = torch.cat(train)
    counts = Counter(train_ids.tolist())
    vocab = sorted((t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t))
    return Corpus(
        train=train_ids,
        held_out=held,
        held_out_names=names,
        vocab=torch.tensor(vocab, dtype=torch.long),
        files=len(files),
        python=sys.version.split()[0],
    )


def windows(ids: torch.Tensor, length: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """`count` random windows [count, length] of `ids` (start positions drawn from `gen`)."""
    starts = torch.randint(0, ids.numel() - length, (count,), generator=gen)
    return torch.stack([ids[s : s + length] for s in starts.tolist()])
