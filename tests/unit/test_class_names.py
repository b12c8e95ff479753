"""One name, one class: no two public classes of the package share a name (the generated
protocol stubs aside), so a name found in a log, a trace or a review means one thing."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuslice"
GENERATED = "_proto"


def public_classes(root: Path) -> dict[str, list[str]]:
    """Class name -> the modules defining it at top level (public names only)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if GENERATED in path.parts:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(path.relative_to(root)))
    return found


def test_no_two_public_classes_share_a_name() -> None:
    shared = {name: paths for name, paths in public_classes(SRC).items() if len(paths) > 1}
    assert shared == {}


def test_a_shared_name_is_found(tmp_path: Path) -> None:
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("class Verdict:\n    pass\n\nclass _Own:\n    pass\n")
    assert public_classes(tmp_path) == {"Verdict": ["a.py", "b.py"]}
