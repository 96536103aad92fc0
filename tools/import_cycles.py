"""Fail when the project's modules import each other in a cycle.

Every import counts, wherever it is written: at the top, inside a function,
or under ``if TYPE_CHECKING`` — a cycle hidden in a function is still a
cycle. ``from package import name`` is an import of ``package.name`` when that
is a module, else of ``package``. A package's ``__init__`` is not counted as
imported by its own submodules (Python runs it first, whatever they import).

    python tools/import_cycles.py        # exit 1, naming each cycle
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where each top-level package lives: the project's packages, the node agent and the launch policy.
PACKAGES = {
    **{
        path.parent.name: ROOT
        for path in sorted(ROOT.glob("*/__init__.py"))
        if path.parent.name not in {"tests", "bench", "tools"}
    },
    "llmgw_agent": ROOT / "agent",
    "llmgw_policy": ROOT / "agent",
}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, base in PACKAGES.items():
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known else origin
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # "catalog.models.Replica" -> "catalog.models"
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(f"{target}."):
                out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    found = cycles(graph)
    for component in found:
        members = set(component)
        edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
        print("import cycle between " + ", ".join(component) + ":\n  " + "\n  ".join(edges))
    if found:
        return 1
    print(f"no import cycle among {len(known)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
