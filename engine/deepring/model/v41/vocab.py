"""Engram's compressed vocabulary: token ids that read the same after normalisation share one id.

Each token is decoded alone (a byte-level BPE piece back to its bytes; a special or added token
is its content); its text is normalised (NFKC, NFD, marks (Mn, Mc, Me) dropped, lower case, runs of
spaces / tabs / newlines made one space, stripped; a token that is only such whitespace keeps
one space); tokens with the same normalised text get the same id, in the order of first
appearance. A piece that is not valid UTF-8 alone keeps its raw vocabulary spelling, so
distinct byte pieces never merge. Read straight from tokenizer.json: no tokenizer library.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

_RUNS = re.compile(r"[ \t\r\n]+")
# Unicode White_Space (what the reference's Strip removes; str.strip also drops \x1c-\x1f).
_WHITE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000")
)


def _byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the others for
    code points from 256 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[chr(b)] = b
        else:
            out[chr(256 + extra)] = b
            extra += 1
    return out


def normalise(text: str) -> str:
    t = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    t = "".join(c for c in t if not unicodedata.category(c).startswith("M"))  # Mn, Mc, Me
    t = "".join(c.lower() for c in t)  # per character: no final-sigma context
    t = _RUNS.sub(" ", t)
    return " " if t == " " else t.strip(_WHITE)


def compressed_vocabulary(tokenizer_json: str | Path) -> list[int]:
    """token id -> compressed id, for every id up to the largest the tokenizer knows."""
    d = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    model = d.get("model") or {}
    if model.get("type") != "BPE" or (d.get("decoder") or {}).get("type") != "ByteLevel":
        raise ValueError("Engram's compressed vocabulary needs a byte-level BPE tokenizer.json")
    pieces = {i: tok for tok, i in model["vocab"].items()}
    added = {t["id"]: t["content"] for t in d.get("added_tokens", [])}
    size = 1 + max([*pieces, *added])
    dec = _byte_decoder()
    keys: dict[str, int] = {}
    out = []
    for i in range(size):
        if i in added:
            text = added[i]
        elif i in pieces:
            text = bytes(dec[c] for c in pieces[i]).decode("utf-8", errors="replace")
        else:
            text = ""
        key = pieces[i] if "\ufffd" in text and i in pieces else (normalise(text) or text)
        out.append(keys.setdefault(key, len(keys)))
    return out
