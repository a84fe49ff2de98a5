"""The package map holds (docs/architecture.md): ``agent/`` imports nothing of ``gateway/`` or
``adapters/``; ``adapters/`` import only ``gateway.core`` of the gateway; the packages of
``gateway/`` import each other without cycles, lazy (function-level) imports included; and
``gateway/`` keeps at most a dozen or so top-level entries."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    found = {}
    for top in ("gateway", "agent", "adapters"):
        for path in (ROOT / top).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every project module ``path`` imports at run time, at any depth (``TYPE_CHECKING`` blocks
    left out: they never run)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                out.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.add(child.module)
                out.update(f"{child.module}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in out if name in MODULES}


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "gateway" and len(parts) > 1 else parts[0]


def test_agent_imports_nothing_of_the_gateway_or_the_adapters():
    wrong = {(m, d) for m, deps in GRAPH.items() if m.startswith("agent") for d in deps
             if d.split(".")[0] in ("gateway", "adapters")}
    assert not wrong, wrong


def test_adapters_import_only_gateway_core():
    wrong = {(m, d) for m, deps in GRAPH.items() if m.startswith("adapters") for d in deps
             if (d.startswith("gateway") and not d.startswith("gateway.core")) or d.startswith("agent")}
    assert not wrong, wrong


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                strong(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            strong(node)
    return found


def test_gateway_packages_import_each_other_without_cycles():
    packages: dict[str, set[str]] = defaultdict(set)
    for module, deps in GRAPH.items():
        if module.startswith("gateway"):
            packages[_package(module)].update(_package(d) for d in deps
                                              if d.startswith("gateway") and _package(d) != _package(module))
    assert _cycles(packages) == []


def test_no_module_import_cycles():
    assert _cycles({m: d for m, d in GRAPH.items() if m.startswith(("gateway", "adapters"))}) == []


def test_gateway_has_about_a_dozen_top_level_entries():
    entries = sorted(p.name for p in (ROOT / "gateway").iterdir()
                     if p.name not in ("__init__.py", "__main__.py", "__pycache__"))
    assert len(entries) <= 14, entries  # 13 capabilities + media (issue 19): files are a capability
    assert all((ROOT / "gateway" / e).is_dir() for e in entries), "every entry is a capability package"
