"""bench.revisions exports another revision's source tree to run beside this one."""

from __future__ import annotations

from pathlib import Path

from bench.revisions import export_src


def test_a_revision_is_exported_as_a_source_tree(tmp_path: Path) -> None:
    src = Path(export_src("HEAD", str(tmp_path)))
    assert src == tmp_path / "src"
    assert (src / "gpuslice" / "__init__.py").is_file()
    assert (src / "gpuslice" / "cli.py").is_file()
    assert not (tmp_path / "tests").exists()  # only src/ travels
