"""Golden label files: every built-in profile under the configs users run, label by label.

Each golden/<case>.labels holds the node's labels as `key=value` lines, sorted, with the
timestamp fixed. A case whose layout no built-in profile has reads a node file from
golden/nodes/. After a deliberate change, regenerate them with

    PYTHONPATH=src .venv/bin/python tests/unit/core/test_labels_golden.py

and review every changed value against the upstream reference before committing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuslice.adapters.fake import load_spec
from gpuslice.config.convert import resource_settings
from gpuslice.config.loader import load_config_file
from gpuslice.core.labels import node_labels
from gpuslice.core.sharing import ResourceSettings

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
NODES = GOLDEN / "nodes"
EXAMPLES = HERE.parents[2] / "examples"
TIMESTAMP = 1700000000

# case -> (built-in profile or node file, example config or None for the defaults,
# ConfigMap entry)
CASES: dict[str, tuple[str, str | None, str | None]] = {
    "t4": ("t4", None, None),
    "t4x4-time-slicing": ("t4x4", "time-slicing.yaml", None),
    "t4x4-time-slicing-renamed": ("t4x4", "time-slicing-renamed.yaml", None),
    "dgx-a100": ("dgx-a100", None, None),
    "a100-40gb": ("a100-40gb", None, None),
    "a100-40gb-mig-mixed": ("a100-40gb-mig-mixed", "time-slicing-configmap.yaml", "a100-40gb"),
    "a100-40gb-mig-single": ("a100-40gb-mig-single", "mig-single.yaml", None),
    # Two MIG profiles under migStrategy single: gpu.* reads MIG-INVALID.
    "a100-40gb-mig-single-invalid": (
        str(NODES / "a100-40gb-mig-two-profiles.yaml"),
        "mig-single.yaml",
        None,
    ),
    # MIG-enabled GPUs under migStrategy none: listed as full GPUs, replicas 0, not shared.
    "a100-40gb-mig-single-none-time-slicing": ("a100-40gb-mig-single", "time-slicing.yaml", None),
    "h100-80gb": ("h100-80gb", None, None),
    "h100-80gb-mps": ("h100-80gb", "mps.yaml", None),
    "dgx-h100": ("dgx-h100", None, None),
}


def render(case: str) -> str:
    profile, config, entry = CASES[case]
    settings = ResourceSettings()
    if config is not None:
        settings = resource_settings(load_config_file(EXAMPLES / config, name=entry).config)
    labels = node_labels(load_spec(profile), settings, timestamp=TIMESTAMP)
    return "".join(f"{key}={value}\n" for key, value in sorted(labels.items()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_labels_match_the_golden_file(case: str) -> None:
    """A fresh computation gives exactly the reviewed labels of the golden file."""
    assert render(case) == (GOLDEN / f"{case}.labels").read_text(encoding="utf-8")


def test_every_golden_file_has_a_case() -> None:
    """No stale golden file lingers after a case is renamed or dropped."""
    assert sorted(p.stem for p in GOLDEN.glob("*.labels")) == sorted(CASES)


def regenerate() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for case in sorted(CASES):
        (GOLDEN / f"{case}.labels").write_text(render(case), encoding="utf-8")
        print(f"wrote {GOLDEN / case}.labels", file=sys.stderr)


if __name__ == "__main__":
    regenerate()
