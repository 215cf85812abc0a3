"""Messages to ZeroMQ frames and back (see ipc.messages for the format).

`decode` never raises on bad input: a frame set that is not a message of a known type and
version (or whose fields have the wrong types) is logged and answered with None, so a stray or
newer peer cannot crash a process. `decode_strict` raises MessageError, and only MessageError,
for any input whatsoever (tests/engine/test_ring_fuzz.py feeds it random frames).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from deepring.ipc.messages import F32, IDS, MESSAGE_TYPES, Message

log = logging.getLogger("deepring.ipc")

_IDS_DTYPE = np.dtype("<i4")
_F32_DTYPE = np.dtype("<f4")
# The numeric payload kinds and their element types.
_ARRAYS = {IDS: _IDS_DTYPE, F32: _F32_DTYPE}


class MessageError(ValueError):
    """A frame set that is not a valid message."""


# Scalar field types by annotation name; float fields accept ints (msgpack keeps 1.0 as float
# but a sender may write 1).
_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


def _spec(cls: type[Message]) -> tuple[list, list, dict[str, Any]]:
    """The header fields (name, accepted types), the payload frames (name, kind) and the typed
    map fields (name -> class with to_wire / from_wire) of a message type."""
    scalars, frames, structs = [], [], {}
    for f in dataclasses.fields(cls):
        kind = f.metadata.get("frame")
        if kind is not None:
            frames.append((f.name, kind))
            continue
        struct = f.metadata.get("struct")
        if struct is not None:  # travels in the header as a map (or nil when optional)
            scalars.append((f.name, (dict, type(None)) if f.metadata.get("optional") else (dict,)))
            structs[f.name] = struct
            continue
        base = str(f.type).split("[", 1)[0].strip()
        if base not in _SCALARS:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported wire type {f.type!r}")
        scalars.append((f.name, _SCALARS[base]))
    return scalars, frames, structs


_REGISTRY: dict[str, tuple[type[Message], list, list, dict[str, Any]]] = {}
for _cls in MESSAGE_TYPES:
    _REGISTRY[_cls.TYPE] = (_cls, *_spec(_cls))


def _array_buffer(value: Any, dtype: np.dtype) -> memoryview:
    arr = np.ascontiguousarray(value, dtype=dtype)
    if arr.ndim != 1:
        raise MessageError(f"payload arrays must be one-dimensional, got shape {arr.shape}")
    return memoryview(arr).cast("B")


def encode(msg: Message) -> list[Any]:
    """The frames of `msg`: the msgpack header, then one frame per payload field."""
    cls, scalars, frames, structs = _REGISTRY[msg.TYPE]
    if type(msg) is not cls:
        raise MessageError(f"{type(msg).__name__} is not a registered message")
    header: dict[str, Any] = {"t": cls.TYPE, "v": cls.VERSION}
    for name, _ in scalars:
        value = getattr(msg, name)
        header[name] = value.to_wire() if name in structs and value is not None else value
    out: list[Any] = [msgpack.packb(header, use_bin_type=True)]
    for name, kind in frames:
        value = getattr(msg, name)
        dtype = _ARRAYS.get(kind)
        out.append(_array_buffer(value, dtype) if dtype is not None else value)
    return out


def decode_strict(frames: Sequence[Any]) -> Message:
    """The message in `frames`; MessageError when they are not one."""
    if not frames:
        raise MessageError("empty message")
    try:
        # TypeError: a map key that is itself a map or an array (unhashable).
        header = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise MessageError(f"undecodable header: {type(e).__name__}") from None
    if not isinstance(header, dict):
        raise MessageError("header is not a map")
    tag, version = header.get("t"), header.get("v")
    entry = _REGISTRY.get(tag) if isinstance(tag, str) else None
    if entry is None:
        raise MessageError(f"unknown message type {tag!r:.40}")
    cls, scalars, frame_fields, structs = entry
    # 1.0 and True compare equal to 1: the version must be an integer, not just equal to one.
    if type(version) is not int or version != cls.VERSION:
        raise MessageError(
            f"{tag} schema version {version!r:.20} (this process reads {cls.VERSION})"
        )
    kwargs: dict[str, Any] = {}
    for name, types in scalars:
        if name not in header:
            raise MessageError(f"{tag}: missing field {name!r}")
        value = header[name]
        if not isinstance(value, types) or (types == (int,) and isinstance(value, bool)):
            raise MessageError(f"{tag}.{name}: expected {types[0].__name__}, got {value!r:.60}")
        kwargs[name] = float(value) if types == _SCALARS["float"] else value
    for name, struct in structs.items():
        if kwargs[name] is None:  # an optional struct (the codec's types allowed nil)
            continue
        try:
            kwargs[name] = struct.from_wire(kwargs[name])
        except (ValueError, TypeError) as e:
            raise MessageError(f"{tag}.{name}: {e}") from None
    if len(frames) != 1 + len(frame_fields):
        raise MessageError(f"{tag}: {len(frames) - 1} payload frames, expected {len(frame_fields)}")
    for (name, kind), frame in zip(frame_fields, frames[1:], strict=True):
        try:
            buf = memoryview(frame)
        except TypeError:
            raise MessageError(f"{tag}.{name}: not a buffer") from None
        dtype = _ARRAYS.get(kind)
        if dtype is not None:
            if buf.nbytes % dtype.itemsize:
                raise MessageError(
                    f"{tag}.{name}: {buf.nbytes} bytes is not a whole {dtype.name} array"
                )
            kwargs[name] = np.frombuffer(buf, dtype=dtype)
        else:
            kwargs[name] = frame
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # a message's own __post_init__ checks, if any
        raise MessageError(f"{tag}: {e}") from None


def decode(frames: Sequence[Any], source: str = "peer") -> Message | None:
    """The message in `frames`, or None (logged) when they are not a valid one."""
    try:
        return decode_strict(frames)
    except MessageError as e:
        log.warning("dropped a message from %s: %s", source, e)
        return None
