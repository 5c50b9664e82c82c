"""The repository's layering (docs/DESIGN.md, "Repository layout"): the components (workers, streams,
trainer) talk only through topics and share only `astraflow/`, so no component's code imports
another's, and the shared spine imports none of them (the `astraflow` CLI finds a component's
command by its module name)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("workers", "streams", "trainer")


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in the file, lazy ones inside functions included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def test_no_component_imports_another_and_the_spine_imports_none() -> None:
    crossings = []
    for package in (*COMPONENTS, "astraflow"):
        for path in sorted((REPO / package).rglob("*.py")):
            for line, module in imported(path):
                top = module.split(".")[0]
                if top in COMPONENTS and top != package:
                    crossings.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert crossings == []


def test_the_check_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from workers.demonstrations import check\n    import streams.app\n")
    assert imported(sample) == [(2, "workers.demonstrations"), (3, "streams.app")]
