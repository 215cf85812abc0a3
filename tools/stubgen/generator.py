"""Runtime introspection: the stub text of the built module.

What comes from the runtime: every public name of the module (classes, exceptions and their
bases, functions, constants, `__all__`), each class's constructor, methods, static and class
methods (names, parameter kinds and defaults from `__text_signature__`), properties (read-only or
writable), enum-like members, class attributes, `@final` (not subclassable) and docstrings.
The annotations come from tables.py.
"""

from __future__ import annotations

import inspect
import re
import types
from typing import Any

from .docs import DOCS
from .helpers import (
    _all_key,
    _default,
    _doc,
    _docstring,
    _indent,
    _is_disjoint_base,
    _is_property,
    _is_writable,
    _label,
    _public,
    _used_aliases,
    _value_type,
)
from .tables import ABC_NAMES, ALIASES, DUNDERS, PARAMS, SKIP_DUNDERS, TYPES, TYPING_NAMES

MODULE = "deepring_recipe._native"


class Generator:
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.fallbacks: list[str] = []
        # Runtime class object -> the name the module exports it under (an exception's
        # `__name__` can differ from its exported name).
        self.exported: dict[int, str] = {
            id(v): k for k, v in vars(module).items() if isinstance(v, type) and _public(k)
        }

    # annotations

    def _spec(self, cls: str, member: str) -> Any:
        spec, shared = TYPES.get(cls, {}).get(member), TYPES["*"].get(member)
        if isinstance(spec, dict) and isinstance(shared, dict):
            return {**shared, **spec}
        return shared if spec is None else spec

    def _fallback(self, where: str) -> str:
        self.fallbacks.append(where)
        return "Any"

    def _param_type(self, spec: dict[str, str], cls: str, func: str, p: inspect.Parameter) -> str:
        ann = spec.get(p.name) or spec.get("*") or PARAMS.get(p.name)
        if ann is None:
            ann = self._fallback(f"{_label(cls, func)}({p.name})")
        ann = ann.replace("{cls}", cls)
        if p.default is None and ann != "Any" and "None" not in ann.split(" | "):
            ann += " | None"
        return ann

    # signatures

    def _signature(self, obj: Any) -> inspect.Signature | None:
        if getattr(obj, "__text_signature__", None) is None:
            return None
        try:
            return inspect.signature(obj)
        except (TypeError, ValueError):
            return None

    def _def(self, cls: str, name: str, obj: Any, kind: str, doc: str | None) -> list[str]:
        """One `def` from a text signature; kind: method, static, class, new or function."""
        target = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
        sig = self._signature(target)
        params = list(sig.parameters.values()) if sig else []
        spec = self._spec(cls, name) if kind != "function" else TYPES.get("", {}).get(name)
        spec = spec if isinstance(spec, dict) else {}
        if kind in ("method", "class") and params:
            params = params[1:]  # $self / $cls
        if sig is None:
            first = {"method": "self, ", "class": "cls, ", "new": "cls, "}.get(kind, "")
            args = f"{first}*args: Any, **kwargs: Any"
            self._fallback(f"{_label(cls, name)}(...)")
        else:
            args = self._params(spec, cls, name, params, kind)
        ret = spec.get("return")
        if ret is None:
            ret = cls if kind == "new" else self._fallback(f"{_label(cls, name)} return")
        ret = ret.replace("{cls}", cls)
        deco = {"static": ["@staticmethod"], "class": ["@classmethod"]}.get(kind, [])
        line = f"def {name}({args}) -> {ret}:"
        return [*deco, *([line, *_indent(_docstring(doc))] if doc else [line + " ..."])]

    def _params(
        self, spec: dict[str, str], cls: str, func: str, params: list[inspect.Parameter], kind: str
    ) -> str:
        out: list[str] = {"method": ["self"], "class": ["cls"], "new": ["cls"]}.get(kind, [])
        P = inspect.Parameter
        star = slash = False
        for i, p in enumerate(params):
            if p.kind is P.POSITIONAL_ONLY:
                slash = True
            elif slash:
                out.append("/")
                slash = False
            if p.kind is P.KEYWORD_ONLY and not star:
                out.append("*")
                star = True
            ann = self._param_type(spec, cls, func, p)
            if p.kind is P.VAR_POSITIONAL:
                out.append(f"*{p.name}: {ann}")
                star = True
            elif p.kind is P.VAR_KEYWORD:
                out.append(f"**{p.name}: {ann}")
            else:
                default = "" if p.default is P.empty else f" = {_default(p.default)}"
                out.append(f"{p.name}: {ann}{default}")
            if slash and i == len(params) - 1:
                out.append("/")
        return ", ".join(out)

    # classes

    def _class(self, name: str, cls: type) -> list[str]:
        bases = [self._base(b) for b in cls.__bases__ if b is not object]
        head = f"class {name}({', '.join(bases)}):" if bases else f"class {name}:"
        if not cls.__flags__ & (1 << 10):  # no Py_TPFLAGS_BASETYPE
            lines = ["@final", head]
        elif _is_disjoint_base(cls):
            lines = ["@disjoint_base", head]
        else:
            lines = [head]
        body: list[str] = []
        doc = _doc(cls) or DOCS.get(name)
        if doc:
            body += [*_docstring(doc), ""]
        own = vars(cls)
        members: list[str] = []
        props: list[tuple[str, Any]] = []
        for key, value in own.items():
            if isinstance(value, cls):  # enum-like member
                members.append(f"{key}: {name}")
            elif _is_property(value) and key not in SKIP_DUNDERS:
                props.append((key, value))
            elif key.startswith("__") and key.endswith("__"):
                continue
            elif not callable(value) and not isinstance(value, (staticmethod, classmethod)):
                spec = self._spec(name, key)
                ann = spec if isinstance(spec, str) else _value_type(value)
                members.append(f"{key}: {ann or self._fallback(f'{name}.{key}')}")
        body += members
        if own.get("__hash__", 0) is None:
            body.append("__hash__: ClassVar[None]  # type: ignore[assignment]")
        if "__new__" in own:
            body += self._def(name, "__new__", cls, "new", DOCS.get(f"{name}.__new__"))
        order = list(TYPES.get(name, {}))
        props.sort(key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))
        for key, value in props:
            body += self._property(name, key, value)
        for key, value in own.items():
            if key.startswith("__") and key.endswith("__"):
                if key in DUNDERS:
                    body.append(DUNDERS[key].replace("{cls}", name))
                elif key not in SKIP_DUNDERS and callable(value) and not isinstance(value, cls):
                    body += self._def(name, key, value, "method", None)
                continue
            doc = _doc(value) or DOCS.get(f"{name}.{key}")
            if isinstance(value, staticmethod):
                body += self._def(name, key, value, "static", doc)
            elif isinstance(value, (classmethod, types.ClassMethodDescriptorType)):
                body += self._def(name, key, value, "class", doc)
            elif callable(value) and not isinstance(value, (type, cls)):
                body += self._def(name, key, value, "method", doc)
        while body and not body[-1]:
            body.pop()
        return lines + _indent(body or ["..."])

    def _property(self, cls: str, key: str, value: Any) -> list[str]:
        spec = self._spec(cls, key)
        get, put = (spec, spec) if isinstance(spec, str) else (spec or (None, None))
        if get is None:
            get = put = self._fallback(f"{cls}.{key}")
        doc = _doc(value) or DOCS.get(f"{cls}.{key}")
        line = f"def {key}(self) -> {get}:"
        out = ["@property", *([line, *_indent(_docstring(doc))] if doc else [line + " ..."])]
        if _is_writable(value):
            out += [f"@{key}.setter", f"def {key}(self, value: {put}) -> None: ..."]
        return out

    def _base(self, base: type) -> str:
        if id(base) in self.exported:
            return self.exported[id(base)]
        if base.__module__ == "builtins":
            return base.__qualname__
        raise SystemExit(f"gen_stub: base {base!r} is neither exported nor a builtin")

    # module

    def generate(self) -> str:
        m = self.module
        names = list(getattr(m, "__all__", None) or sorted(n for n in vars(m) if _public(n)))
        names += [n for n in vars(m) if _public(n) and n not in names]
        consts: list[str] = []
        body: list[str] = []
        classes: list[str] = []
        for name in names:
            value = getattr(m, name)
            if isinstance(value, type):
                classes.append(name)
            elif callable(value):
                doc = _doc(value)
                body.append("")
                body += self._def("", name, value, "function", doc)
            else:
                spec = TYPES.get("", {}).get(name)
                ann = spec or _value_type(value) or self._fallback(name)
                consts.append(f"{name}: {ann}")
        for name in classes:
            body.append("")
            body += self._class(name, getattr(m, name))
        body = consts + body
        text = "\n".join(body)
        aliases = _used_aliases(text)
        alias_lines = [f"{k}: TypeAlias = {ALIASES[k]}" for k in aliases]
        used_text = text + "\n".join(alias_lines)
        header = [
            f"# Generated from the built {MODULE} by tools/gen_stub.py: do not edit by hand;",
            "# annotations come from the tables in that script. Regenerate with `./dev stub`.",
            "",
        ]
        abc = [n for n in ABC_NAMES if re.search(rf"\b{n}\b", used_text)]
        typing = [n for n in TYPING_NAMES if re.search(rf"\b{n}\b", used_text)]
        if abc:
            header.append(f"from collections.abc import {', '.join(abc)}")
        if typing:
            header.append(f"from typing import {', '.join(typing)}")
        if "@disjoint_base" in text:
            header += ["", "from typing_extensions import disjoint_base"]
        if hasattr(m, "__all__"):
            header += ["", "__all__ = ["]
            header += [f'    "{n}",' for n in sorted(m.__all__, key=_all_key)]
            header.append("]")
        if alias_lines:
            header += ["", *alias_lines]
        return "\n".join([*header, "", *body, ""])
