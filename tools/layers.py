"""Fail when a package imports another that docs/design.md's table of layers does not allow.

The table under "## Layers" in docs/design.md is the one source: each row names a package (first
column, in backticks) and what it may import (last column: the packages in backticks, or "nothing").
A table under it lists the upward imports allowed, module by module, each with its reason.

Every import counts, wherever it is written: at the top, inside a function, or under
``if TYPE_CHECKING``. A package the table leaves out (tests, bench, tools) is not checked.

The planning core is checked once more: nothing it imports, directly or through the project's
modules it reaches, may be anything but the standard library and the project's own modules, so
that it never reaches Django through a module of ``base``.

    python tools/layers.py               # exit 1, naming each import against the table
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
PURE = "planning"  # the core that reaches nothing but the standard library and the project


@dataclass
class Table:
    allowed: dict[str, set[str]]  # package -> the packages it may import
    upward: dict[tuple[str, str], str]  # (module, module it imports) -> why


def read_table(text: str) -> Table:
    """The layers and the allowed upward imports, as docs/design.md writes them."""
    if "\n## Layers" not in text:
        raise SystemExit(f"{DESIGN}: no section '## Layers'")
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    layers, _, exceptions = section.partition("### Upward imports")
    allowed: dict[str, set[str]] = {}
    for cells in _rows(layers):
        names = re.findall(r"`(\w+)`", cells[0])
        if len(cells) >= 3 and len(names) == 1:
            allowed[names[0]] = {n.split(".")[0] for n in re.findall(r"`([\w.]+)`", cells[-1])}
    upward = {
        (cells[0].strip("`"), cells[1].strip("`")): cells[2]
        for cells in _rows(exceptions)
        if len(cells) == 3 and cells[0].startswith("`") and cells[1].startswith("`")
    }
    if not allowed:
        raise SystemExit(f"{DESIGN}: no table of layers under '## Layers'")
    return Table(allowed, upward)


def _rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]


def modules(packages: set[str], root: Path) -> dict[str, Path]:
    """Every module of these packages (a package is a folder of ``root`` or of ``root/agent``)."""
    found: dict[str, Path] = {}
    for package in sorted(packages):
        base = root if (root / package).is_dir() else root / "agent"
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    target: str  # the dotted name imported, as far as it resolves


def imports_of(name: str, path: Path) -> list[Import]:
    is_package = path.name == "__init__.py"
    out: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [Import(name, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                base = parts[: len(parts) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            out += [Import(name, node.lineno, f"{origin}.{alias.name}") for alias in node.names]
    return out


def resolve(target: str, known: dict[str, Path]) -> str:
    """The project module a dotted name lands in ("catalog.models.Node" -> "catalog.models")."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target


def check(root: Path = ROOT, design: Path = DESIGN) -> list[str]:
    table = read_table(design.read_text())
    known = modules(set(table.allowed), root)
    problems: list[str] = []
    graph: dict[str, list[Import]] = {name: imports_of(name, path) for name, path in known.items()}
    for name, found in graph.items():
        own = name.split(".")[0]
        for imp in found:
            top = imp.target.split(".")[0]
            if top == own or top not in table.allowed:
                continue
            target = resolve(imp.target, known) or top
            if top in table.allowed[own] or (name, target) in table.upward:
                continue
            problems.append(
                f"{known[name].relative_to(root)}:{imp.line}: {name} imports {target}, but `{own}` may import "
                f"{', '.join(sorted(table.allowed[own])) or 'nothing of the project'} (docs/design.md, '## Layers')"
            )
    if PURE in table.allowed:
        problems += pure_core_problems(graph, known, root)
    return problems


def pure_core_problems(graph: dict[str, list[Import]], known: dict[str, Path], root: Path) -> list[str]:
    """Every module the planning core reaches, and what outside the standard library each imports."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    problems: list[str] = []
    seen: dict[str, str] = {}  # module -> the module that brought it in
    reported: set[tuple[str, str]] = set()
    todo = [name for name in known if name.split(".")[0] == PURE]
    for name in todo:
        seen.setdefault(name, name)
    while todo:
        name = todo.pop()
        for imp in graph.get(name, []):
            top = imp.target.split(".")[0]
            target = resolve(imp.target, known)
            if target:
                if target not in seen:
                    seen[target] = name
                    todo.append(target)
                continue
            if top not in stdlib and (name, top) not in reported:
                reported.add((name, top))
                chain = [name]
                while seen[chain[-1]] != chain[-1]:
                    chain.append(seen[chain[-1]])
                problems.append(
                    f"{known[name].relative_to(root)}:{imp.line}: the planning core reaches {top} "
                    f"({' <- '.join(chain)}): it may import only the standard library and the project's "
                    "modules that do the same"
                )
    return problems


def main() -> int:
    problems = check()
    for problem in problems:
        print(problem)
    if problems:
        return 1
    table = read_table(DESIGN.read_text())
    print(f"every import follows the {len(table.allowed)} layers of docs/design.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
