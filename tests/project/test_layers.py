"""The layer check (tools/layers.py) reads docs/design.md's table and fails on an import against it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tools import layers

ROOT = Path(__file__).resolve().parents[2]

DESIGN = """# A design

## Layers

| package | holds | may import |
|---|---|---|
| `low` | plumbing | nothing |
| `planning` | the pure core | `low` |
| `mid` | an app | `low`, `planning` |
| `top` | pages | `low`, `mid` |

### Upward imports

| module | imports | why |
|---|---|---|
| `mid.services` | `top.guard` | the one reason |

## Next section

| `ignored` | not a layer | `top` |
"""


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text(DESIGN)
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


CLEAN = {
    "low/__init__.py": "",
    "low/errors.py": "import json\n",
    "low/views.py": "from django.http import HttpResponse\n",
    "planning/__init__.py": "from low.errors import json\n",
    "mid/__init__.py": "",
    "mid/services.py": "from low import errors\nfrom planning import json\nfrom top.guard import check\n",
    "top/__init__.py": "",
    "top/guard.py": "from mid.services import errors\n",
}


def problems(tmp_path: Path, files: dict[str, str]) -> list[str]:
    root = tree(tmp_path, files)
    return layers.check(root, root / "docs" / "design.md")


def test_the_table_is_read_from_its_section_only() -> None:
    table = layers.read_table(DESIGN)
    assert table.allowed == {
        "low": set(),
        "planning": {"low"},
        "mid": {"low", "planning"},
        "top": {"low", "mid"},
    }
    assert table.upward == {("mid.services", "top.guard"): "the one reason"}


def test_imports_that_follow_the_table_pass(tmp_path: Path) -> None:
    assert problems(tmp_path, CLEAN) == []


def test_an_upward_import_fails_naming_the_line_and_the_table(tmp_path: Path) -> None:
    found = problems(tmp_path, {**CLEAN, "low/errors.py": "import json\nfrom mid import services\n"})
    assert found == [
        "low/errors.py:2: low.errors imports mid.services, but `low` may import nothing of the project "
        "(docs/design.md, '## Layers')"
    ]


def test_an_import_inside_a_function_counts(tmp_path: Path) -> None:
    hidden = "def f():\n    from top.guard import check\n    return check\n"
    found = problems(tmp_path, {**CLEAN, "mid/other.py": hidden})
    assert [p.split(": ", 1)[0] for p in found] == ["mid/other.py:2"]


def test_an_upward_import_is_allowed_only_from_the_module_the_table_names(tmp_path: Path) -> None:
    found = problems(tmp_path, {**CLEAN, "mid/other.py": "from top import guard\n"})
    assert len(found) == 1 and "mid.other imports top.guard" in found[0]


def test_the_planning_core_may_not_reach_django_through_a_module_it_is_allowed(tmp_path: Path) -> None:
    found = problems(tmp_path, {**CLEAN, "planning/rules.py": "from low.views import HttpResponse\n"})
    assert len(found) == 1
    assert "the planning core reaches django (low.views <- planning.rules)" in found[0]


def test_the_planning_core_may_not_import_a_third_party_package_itself(tmp_path: Path) -> None:
    found = problems(tmp_path, {**CLEAN, "planning/rules.py": "import httpx\n"})
    assert len(found) == 1 and "reaches httpx (planning.rules)" in found[0]


def test_the_project_follows_its_own_table() -> None:
    assert layers.check() == []


def test_make_lint_runs_the_check_and_fails_on_a_new_import_against_the_table(tmp_path: Path) -> None:
    """The check as `make lint` runs it, on a copy of the project with one import against the table."""
    copy = tmp_path / "project"
    shutil.copytree(
        ROOT,
        copy,
        ignore=shutil.ignore_patterns(".git", ".venv", ".tools", "var", "node_modules", "__pycache__"),
    )
    assert "tools/layers.py" in (ROOT / "Makefile").read_text()
    ok = subprocess.run([sys.executable, "tools/layers.py"], cwd=copy, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout
    selectors = copy / "catalog" / "selectors.py"
    selectors.write_text(selectors.read_text() + "\nfrom operations.services import resize  # noqa: E402\n")
    refused = subprocess.run([sys.executable, "tools/layers.py"], cwd=copy, capture_output=True, text=True)
    assert refused.returncode == 1
    assert "catalog.selectors imports operations.services.resize" in refused.stdout


def test_every_package_of_the_project_is_in_the_table() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench", "tools"}
    assert packages <= set(layers.read_table((ROOT / "docs" / "design.md").read_text()).allowed)
