"""Helpers of the generator: runtime checks of descriptors and classes, text of the stub."""

from __future__ import annotations

import ctypes
import inspect
import re
import sys
from typing import Any

from .tables import ALIASES


def _label(cls: str, member: str) -> str:
    return f"{cls}.{member}" if cls else member


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__version__"


def _doc(obj: Any) -> str | None:
    doc = obj.__doc__ if not isinstance(obj, (staticmethod, classmethod)) else obj.__func__.__doc__
    if isinstance(obj, (int, str, float, bool)) or not doc:
        return None
    return inspect.cleandoc(doc)


def _docstring(doc: str) -> list[str]:
    doc = doc.replace("\\", "\\\\").replace('"""', r"\"\"\"")
    lines = (doc + " " if doc.endswith('"') else doc).split("\n")
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    return lines


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line if line else "" for line in lines]


def _default(value: Any) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str) and len(value) < 40 and value.isprintable():
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "..."


def _value_type(value: Any) -> str | None:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" and t is not type(None) else None


def _is_property(value: Any) -> bool:
    return isinstance(value, property) or inspect.isgetsetdescriptor(value)


def _is_writable(desc: Any) -> bool:
    """Whether a property or getset descriptor has a setter."""
    if isinstance(desc, property):
        return desc.fset is not None
    # CPython: PyGetSetDescrObject is {PyObject_HEAD; d_type; d_name; d_qualname; d_getset}, and
    # PyGetSetDef is {name; get; set; doc; closure}. Cross-check d_name before trusting it.
    ptr = ctypes.sizeof(ctypes.c_void_p)
    base = id(desc) + object.__basicsize__
    name = ctypes.c_void_p.from_address(base + ptr).value
    if name != id(desc.__name__):
        raise SystemExit(f"gen_stub: unexpected getset descriptor layout ({desc!r})")
    getset = ctypes.c_void_p.from_address(base + 3 * ptr).value
    return bool(getset) and ctypes.c_void_p.from_address(getset + 2 * ptr).value is not None


def _is_disjoint_base(cls: type) -> bool:
    """PEP 800: the instance layout differs from the base's (CPython's shape_differs(), as
    mypy.stubtest mirrors it), so the class cannot share a subclass with another such base."""
    base = cls.__base__
    if base is None:
        return True
    if sys.version_info >= (3, 12) or cls.__itemsize__ or base.__itemsize__:
        return cls.__basicsize__ != base.__basicsize__ or cls.__itemsize__ != base.__itemsize__
    size, word = cls.__basicsize__, ctypes.sizeof(ctypes.c_void_p)
    if not base.__weakrefoffset__ and cls.__weakrefoffset__ + word == size:
        size -= word
    if not base.__dictoffset__ and cls.__dictoffset__ + word == size:
        size -= word
    return size != base.__basicsize__


def _used_aliases(text: str) -> list[str]:
    used: list[str] = []
    pending = [k for k in ALIASES if re.search(rf"\b{k}\b", text)]
    while pending:
        k = pending.pop(0)
        if k in used:
            continue
        used.append(k)
        pending += [a for a in ALIASES if re.search(rf"\b{a}\b", ALIASES[k]) and a not in used]
    return [k for k in ALIASES if k in used]


def _all_key(name: str) -> tuple[int, list[Any]]:
    """ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest; digits naturally."""
    group = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    parts = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
    return group, parts
