"""The header every stored block carries, in a file of the directory store and in a Redis value.

The engine's block records check themselves, but a store must also notice what the engine never
sees: a file renamed onto another key's name, a value written by another program under our
prefix, a header damaged on disk, a block cut short by a crash. So each stored value is this
64-byte header followed by the block (format version 1, little-endian):

| offset | size | field |
|---|---|---|
| 0 | 4 | magic `DRKB` |
| 4 | 2 | format version (1) |
| 6 | 2 | reserved, zero |
| 8 | 32 | the block's key |
| 40 | 8 | TTL in milliseconds: the life a hit renews |
| 48 | 8 | length of the value |
| 56 | 4 | crc32 of the value |
| 60 | 4 | crc32 of bytes 0..59 |

There is no expiry time in the header: Redis keeps it itself, and the directory store keeps it
in the file's mtime (see directory.py), so renewing it never rewrites the header.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import NamedTuple

MAGIC = b"DRKB"
VERSION = 1
KEY_BYTES = 32
_BODY = struct.Struct("<4sHH32sQQI")  # everything the header crc covers
_CRC = struct.Struct("<I")
HEADER_BYTES = _BODY.size + _CRC.size
assert HEADER_BYTES == 64  # the table above


class FrameError(ValueError):
    """A stored value that is not a valid block of the key asked for."""


class Header(NamedTuple):
    key: bytes
    ttl_ms: int
    length: int
    crc: int


MAX_TTL_S = 10 * 365 * 86400  # far beyond any cache's use; keeps every TTL a sane integer


def ttl_to_ms(ttl_s: float) -> int:
    """A TTL in seconds as whole milliseconds (at least 1); a TTL that is not a number in
    (0, MAX_TTL_S] is a ValueError."""
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)):
        raise TypeError(f"a TTL is a number of seconds, got {type(ttl_s).__name__}")
    if not (0 < ttl_s <= MAX_TTL_S):  # also refuses nan
        raise ValueError(f"a TTL must be a number of seconds in (0, {MAX_TTL_S}], got {ttl_s!r}")
    return max(1, math.ceil(ttl_s * 1000))


def pack_header(key: bytes, ttl_ms: int, value: bytes | memoryview) -> bytes:
    """The 64-byte header of `value` stored under `key` with a TTL of `ttl_ms`."""
    body = _BODY.pack(MAGIC, VERSION, 0, key, ttl_ms, len(value), zlib.crc32(value))
    return body + _CRC.pack(zlib.crc32(body))


def parse_header(raw: bytes | memoryview, key: bytes) -> Header:
    """The header at the start of `raw`, which must belong to `key`; FrameError otherwise."""
    if len(raw) < HEADER_BYTES:
        raise FrameError(f"{len(raw)} bytes: shorter than a header")
    body = raw[: _BODY.size]
    magic, version, _reserved, stored_key, ttl_ms, length, crc = _BODY.unpack(body)
    # The magic and version are checked before the crc so that a foreign value or a block of
    # another format version is named as such.
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise FrameError(f"format version {version}, this reader knows {VERSION}")
    (header_crc,) = _CRC.unpack_from(raw, _BODY.size)
    if zlib.crc32(body) != header_crc:
        raise FrameError("header checksum mismatch")
    if stored_key != key:
        raise FrameError("the header names another key")
    if ttl_ms == 0:
        raise FrameError("zero TTL")
    return Header(stored_key, ttl_ms, length, crc)


def check_value(header: Header, value: bytes | memoryview) -> None:
    """FrameError unless `value` is the one `header` describes (its length and crc32)."""
    if len(value) != header.length:
        raise FrameError(f"value of {len(value)} bytes, the header says {header.length}")
    if zlib.crc32(value) != header.crc:
        raise FrameError("value checksum mismatch")


def unframe(raw: bytes, key: bytes) -> tuple[Header, bytes]:
    """Header and value of a whole stored value (header + block) of `key`; FrameError when it
    is not a valid one."""
    header = parse_header(raw, key)
    value = raw[HEADER_BYTES:]
    check_value(header, value)
    return header, value
