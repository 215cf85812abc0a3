"""Token id sequences as C arrays: a prompt's ids arrive as a Python list (or, for long HTTP
bodies, an int32 array), and numpy converts a list item by item through Python ints, about 3x
slower than `array.array("I", ids)`. One place for that conversion, used by the prefix digests
(the engine's cache keys and the frontend's estimate) and the engine's range check."""

from __future__ import annotations

import array
import sys

import numpy as np

# array.array("I") items are the "<u4" the prefix digests are defined on where the platform is
# little-endian and its C unsigned int has 4 bytes.
_ARRAY_U4 = sys.byteorder == "little" and array.array("I").itemsize == 4


def u4_bytes(ids) -> bytes:
    """The ids as little-endian uint32 bytes (ids in [0, 2^32))."""
    if _ARRAY_U4 and isinstance(ids, list):
        return array.array("I", ids).tobytes()
    return np.asarray(ids, dtype="<u4").tobytes()


def ids_in_range(token_ids: list[int] | np.ndarray, vocab: int) -> bool:
    """Whether every id is in [0, vocab). A list passes through an array of C unsigned ints
    (which refuses a negative id) and numpy's max: a quarter of the time of min() and max()
    over a long prompt's list, which every prefill and every handoff checks."""
    if isinstance(token_ids, np.ndarray):  # (long prompts arrive as int32 arrays)
        return token_ids.size == 0 or bool(token_ids.min() >= 0 and token_ids.max() < vocab)
    try:
        ids = array.array("I", token_ids)
    except (OverflowError, TypeError):  # negative, past 32 bits, or not an int: decide slowly
        return min(token_ids) >= 0 and max(token_ids) < vocab
    return len(ids) == 0 or int(np.frombuffer(ids, dtype=np.uintc).max()) < vocab
