"""What the generators share: comparing freshly generated files with the committed ones."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

DIFF_LINES = 40  # of each file's unified diff, in the report


def differences(fresh: Mapping[Path, str], committed: Mapping[Path, str | None]) -> list[str]:
    """One line per file that differs, is missing or is stale, plus the head of a diff."""
    lines: list[str] = []
    for path in sorted(fresh.keys() | committed.keys()):
        new, old = fresh.get(path), committed.get(path)
        if new == old:
            continue
        if old is None:
            lines.append(f"missing: {path}")
        elif new is None:
            lines.append(f"stale (no longer generated): {path}")
        else:
            lines.append(f"differs: {path}")
            diff = difflib.unified_diff(
                old.splitlines(),
                new.splitlines(),
                f"committed/{path}",
                f"fresh/{path}",
                lineterm="",
            )
            lines.extend(f"    {d}" for d in list(diff)[:DIFF_LINES])
    return lines
