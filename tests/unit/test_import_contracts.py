"""The import-linter contracts bite: they cover every top-level module of the package, and
each forbidden import planted in a copy of the tree breaks the contract that forbids it
(a contract that lets through what it claims to forbid fails here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "gpuslice"
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]
LINT = Path(sys.executable).with_name("lint-imports")

# (file under src/gpuslice, import planted there, contract expected to break)
PLANTS = [
    ("adapters/hosts/real.py", "pynvml", "Only the NVML adapter imports pynvml"),
    ("adapters/hosts/real.py", "lightkube", "Only the Kubernetes adapter imports lightkube"),
    ("adapters/hosts/real.py", "prometheus_client", "Only the metrics adapter"),
    ("adapters/dra/server.py", "pynvml", "Only the NVML adapter imports pynvml"),
    ("adapters/dra/server.py", "lightkube", "Only the Kubernetes adapter imports lightkube"),
    ("adapters/dra/server.py", "prometheus_client", "Only the metrics adapter"),
    ("wiring/agent.py", "gpuslice.testing.kubelet", "The testing kit is used only by"),
    ("core/errors.py", "yaml", "The core is the standard library alone"),
    ("adapters/kube/node_api.py", "yaml", "Only config.yaml_text imports yaml"),
    ("services/labeller.py", "grpc", "Only the kubelet's gRPC adapters"),
    (
        "frontends/dra/driver.py",
        "gpuslice.frontends.deviceplugin",
        "The front-ends are independent",
    ),
    ("frontends/dra/driver.py", "gpuslice.adapters.kube", "Front-ends reach the node through"),
    ("services/node.py", "gpuslice.adapters.fake", "Only the host modules and the composition"),
    ("commands/inspect.py", "gpuslice.services.isolation", "One composition root"),
    ("core/labels.py", "gpuslice.services", "Layers: "),
    ("core/strategies/mps.py", "gpuslice.core.resources", "A way of sharing stands below"),
    ("testing/configmap.py", "gpuslice.wiring", "The testing kit stands on adapters"),
    ("config/v1.py", "click", "Only the file-watch adapter imports inotify_simple, only the"),
]


def top_level_modules() -> set[str]:
    return {
        f"gpuslice.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }


def test_the_layers_and_the_testing_kit_name_every_top_level_module() -> None:
    (layers,) = [c for c in CONTRACTS if c["type"] == "layers"]
    named = {m.strip() for layer in layers["layers"] for m in re.split(r"[|:]", layer)}
    assert named | {"gpuslice.testing"} == top_level_modules()


@pytest.mark.parametrize(
    "contract",
    [c for c in CONTRACTS if c["type"] == "forbidden" and len(c["source_modules"]) > 2],
    ids=lambda c: c["name"],
)
def test_each_package_wide_contract_has_the_whole_package_as_its_sources(
    contract: dict[str, object],
) -> None:
    """A module left out of a contract's sources is not covered: only the modules the
    contract itself forbids (or that own what it forbids) may be left out."""
    sources = set(contract["source_modules"])  # type: ignore[call-overload]
    forbidden = set(contract["forbidden_modules"])  # type: ignore[call-overload]
    owners = {"gpuslice.cli"} if "click" in forbidden else set()
    left_out = top_level_modules() - sources - forbidden - owners
    assert left_out <= {"gpuslice.testing", "gpuslice.wiring"}, left_out
    if not any(f.startswith("gpuslice.") for f in forbidden):  # a library: wherever it is
        assert left_out == set(), left_out


def broken(output: str) -> dict[str, str]:
    """Each broken contract's name -> what lint-imports says of it."""
    _, _, report = output.partition("Broken contracts")
    sections: dict[str, str] = {}
    names = {c["name"] for c in CONTRACTS}
    current = ""
    for line in report.splitlines():
        if line.strip() in names:
            current = line.strip()
            sections[current] = ""
        elif current:
            sections[current] += line + "\n"
    return sections


def test_every_planted_forbidden_import_breaks_its_contract(tmp_path: Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "src" / "gpuslice", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for path, module, _ in PLANTS:
        with (tmp_path / "src" / "gpuslice" / path).open("a") as f:
            f.write(f"import {module}  # planted\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "COLUMNS": "1000"}
    result = subprocess.run(
        [str(LINT), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 1, result.stdout + result.stderr
    sections = broken(result.stdout)
    for path, module, contract in PLANTS:
        importer = "gpuslice." + path.removesuffix(".py").replace("/", ".")
        (name,) = [n for n in sections if n.startswith(contract)]
        assert f"{importer} -> {module}" in sections[name], (path, module, contract)


def test_the_tree_as_it_is_keeps_every_contract() -> None:
    result = subprocess.run([str(LINT)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout
