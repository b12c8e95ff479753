"""The operator docs quote what the agent really says: every log event name in
troubleshooting.md and migrate.md is one the agent logs, and the NVML line is the one it
prints, so the docs cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuslice.adapters.nvml.backend import DRIVER_ROOT, load_nvml
from gpuslice.core.errors import BackendError
from gpuslice.services.config_manager import REJECTED_REASON

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "troubleshooting.md", ROOT / "docs" / "migrate.md"]
# A snake_case name in backticks, or the event of a quoted log line.
QUOTED = (re.compile(r"`([a-z]+(?:_[a-z0-9]+)+)`"), re.compile(r"event='([a-z_]+)'"))
LITERAL = re.compile(r"""(?<![\w{])["']([a-z]+(?:_[a-z0-9]+)+)["']""")
# Log calls whose event name is an f-string, such as log.warning(f"{what.kind}_watch_broken").
LOGGED_FSTRING = re.compile(r"""\.(?:debug|info|warning|error|exception)\(\s*f["']([^"']+)["']""")


def fillers(src: str) -> dict[str, set[str]]:
    """What each placeholder of an f-string event name can be, read from the source."""
    return {
        "{what.kind}": set(re.findall(r"""Watched\(\s*["'](\w+)["']""", src)),
        "{change.action}": set(re.findall(r"""Change\(\s*\w+,\s*["'](\w+)["']""", src)),
    }


def event_names(src: str) -> set[str]:
    """Every event name the source can log: its snake_case string literals, and each
    f-string event name with each value its placeholder takes."""
    names = set(LITERAL.findall(src))
    values = fillers(src)
    for template in LOGGED_FSTRING.findall(src):
        expanded = {template}
        for placeholder in re.findall(r"\{[^}]*\}", template):
            assert values.get(placeholder), f"unknown values of {placeholder} in f{template!r}"
            expanded = {t.replace(placeholder, v) for t in expanded for v in values[placeholder]}
        names |= expanded
    return names


def source_text() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "src" / "gpuslice").rglob("*.py"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_log_event_the_doc_quotes_is_one_the_agent_logs(doc: Path) -> None:
    text = doc.read_text()
    quoted = {name for pattern in QUOTED for name in pattern.findall(text)}
    assert quoted, "the doc quotes no event"
    unknown = sorted(quoted - event_names(source_text()))
    assert not unknown, f"{doc.name} quotes events the agent never logs: {unknown}"


def test_event_names_built_in_f_strings_are_known_and_others_are_not() -> None:
    names = event_names(source_text())
    assert {"configmap_watch_broken", "node_read_failed", "device_marked"} <= names
    assert not {"configmap_watch_borked", "gpu_watch_broken", "device_exploded"} & names


def test_the_nvml_line_is_the_one_the_agent_prints(tmp_path: Path) -> None:
    def no_library(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    absent = tmp_path / "driver-root"
    with pytest.raises(BackendError) as caught:
        load_nvml(absent, load=no_library)
    error = str(caught.value).replace(str(absent), DRIVER_ROOT)
    assert f"gpuslice: error: {error}\n" in (ROOT / "docs" / "troubleshooting.md").read_text()
    fixes = error.split("; ", 1)[1]  # install.md quotes the fixes after an elided cause
    assert fixes in " ".join((ROOT / "docs" / "install.md").read_text().split())


def test_the_event_reason_is_the_one_the_agent_records() -> None:
    assert f"reason={REJECTED_REASON}" in (ROOT / "docs" / "troubleshooting.md").read_text()
