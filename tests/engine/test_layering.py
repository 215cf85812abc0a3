"""The engine's layering, read from the source (every import, including those inside
functions): no cycle between packages, the cache knows layouts and not the model, the frontend
reaches neither the workers nor the model, and the protocol layer stays free of torch."""

from __future__ import annotations

import ast
from pathlib import Path

import deepring
import pytest

ROOT = Path(deepring.__file__).parent


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _parents(module: str) -> list[str]:
    """Importing a.b.c runs a/__init__ and a/b/__init__ first (the root package excluded: it
    only re-exports, lazily)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def _module_graph() -> dict[str, set[str]]:
    """deepring module -> the deepring modules and third-party top-level packages it imports."""
    modules = {_module_of(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        out = graph.setdefault(module, set(_parents(module)))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from pkg import name` imports pkg.name when that is a module.
                names = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            for name in names:
                if name.startswith("deepring.") or name == "deepring":
                    if name != "deepring":
                        out.add(name)
                        out.update(_parents(name))
                else:
                    out.add("ext:" + name.split(".")[0])
        out.discard(module)
    return graph


MODULES = _module_graph()


def _unit(module: str) -> str:
    """A module's package (deepring.cache.pool -> cache), or the top-level module itself."""
    return module.split(".")[1] if module.startswith("deepring.") else module


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in MODULES.items():
        unit = _unit(module)
        graph.setdefault(unit, set()).update(
            _unit(t) for t in targets if not t.startswith("ext:") and _unit(t) != unit
        )
    return graph


def _reaches(start: set[str], graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_covers_the_packages():
    units = {_unit(m) for m in MODULES}
    assert {"cache", "core", "frontend", "kernels", "model", "protocol", "spec", "worker"} <= units


def test_no_cycle_between_packages():
    graph = _package_graph()
    for unit, targets in graph.items():
        assert unit not in _reaches(targets, graph), f"{unit} imports itself through {targets}"


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("cache", {"model", "core", "worker", "frontend", "kernels"}),
        ("frontend", {"worker", "model", "core", "kernels", "cache", "ext:torch"}),
        ("protocol", {"model", "core", "worker", "frontend", "kernels", "ext:torch"}),
        ("routing", {"worker", "model", "core", "frontend", "ext:torch"}),
        ("ipc", {"model", "core", "worker", "frontend", "ext:torch"}),
        ("kernels", {"model", "core", "worker", "frontend"}),
        ("model", {"core", "worker", "frontend"}),
        ("core", {"worker", "frontend"}),
        # Speculative decoding's math is engine-independent: torch, numpy, sampling (its
        # SplitMix64) and cost (StepCost), never the engine, the model or the processes.
        (
            "spec",
            {"core", "worker", "frontend", "model", "cache", "routing", "ipc", "protocol"},
        ),
        # `deepring conformance` checks a server from outside, with deepring_recipe as the
        # reference: it never shares the serving code it checks, nor needs torch.
        (
            "conformance",
            {
                "frontend",
                "worker",
                "core",
                "model",
                "kernels",
                "cache",
                "routing",
                "ipc",
                "protocol",
                "structured",
                "sampling",
                "ext:torch",
            },
        ),
        # The step-time model is shared by workers, routers and the simulator: numpy only.
        (
            "cost",
            {
                "worker",
                "model",
                "core",
                "frontend",
                "kernels",
                "cache",
                "routing",
                "ipc",
                "ext:torch",
            },
        ),
    ],
)
def test_what_each_package_may_not_reach(package, forbidden):
    """Followed module by module, so importing one light module of a package (ipc ->
    sampling.params) does not count as importing the whole package."""
    mine = {m for m in MODULES if _unit(m) == package}
    reached = _reaches(mine, MODULES)
    hit = {r for r in reached if _unit(r) in forbidden or r in forbidden}
    assert not hit, f"{package} reaches {sorted(hit)}"
