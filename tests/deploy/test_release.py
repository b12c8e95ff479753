"""Release artefacts: one version (pyproject.toml's) in the chart, its package and the image
tag; the chart package is byte-for-byte the same when made twice, is what Helm loads, and its
checksum file verifies; the locks pin a sha256 for every distribution."""

from __future__ import annotations

import hashlib
import re
import tarfile
from pathlib import Path
from types import ModuleType

import helm_python as helm
import pytest
import yaml
from chart_kit import CHART, ROOT, load_tool, tool

TOOL = ROOT / "tools" / "release.py"
LOCKS = sorted((ROOT / "requirements").glob("*.lock"))


def release() -> ModuleType:
    return load_tool(TOOL)


def test_the_version_comes_from_pyproject_only() -> None:
    version = tool().project_version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    build = (ROOT / "deploy" / "image" / "build.sh").read_text()
    assert "image=${IMAGE:-localhost/gpuslice:$version}" in build
    assert "pyproject.toml" in build
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(version)}\b", changelog, re.MULTILINE)


def test_the_chart_package_is_reproducible_and_loads_in_helm(tmp_path: Path) -> None:
    rel = release()
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    one = rel.package_chart(CHART, first, 1_700_000_000)
    two = rel.package_chart(CHART, second, 1_700_000_000)
    assert one.read_bytes() == two.read_bytes()
    assert one.name == f"gpuslice-{tool().project_version()}.tgz"
    later = rel.package_chart(CHART, second, 1_800_000_000)
    assert later.read_bytes() != one.read_bytes()  # the epoch is what stamps it
    with tarfile.open(one) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {
        (1_700_000_000, 0, 0, "", "")
    }
    files = {f"gpuslice/{p.relative_to(CHART).as_posix()}" for p in rel.chart_files(CHART)}
    assert set(names) == files
    assert "gpuslice/templates/daemonset.yaml" in files
    assert "gpuslice/.helmignore" in files  # as helm package keeps it
    with helm.Chart.load_archive(one.read_bytes()) as chart:
        assert chart.version == tool().project_version()
        assert chart.schema is not None
        out = chart.render({}, name="gpu", namespace="gpu-system", is_install=True)
    assert any("kind: DaemonSet" in text for text in out.values())


def test_helmignore_patterns_exclude_as_helm_does() -> None:
    rel = release()
    assert rel.ignored("templates/x.yaml.swp", ["*.swp"])
    assert rel.ignored(".DS_Store", [".DS_Store"])
    assert not rel.ignored("templates/daemonset.yaml", ["*.swp", "*~"])


def test_the_checksum_file_names_each_artefact_with_its_sha256(tmp_path: Path) -> None:
    rel = release()
    package = rel.package_chart(CHART, tmp_path, 0)
    sums = rel.write_sums([package], tmp_path)
    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    assert sums.read_text() == f"{digest}  {package.name}\n"


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_every_locked_distribution_is_pinned_with_a_hash(lock: Path) -> None:
    """pip's --require-hashes refuses a lock with one unhashed pin; check it here, offline."""
    text = lock.read_text()
    entries = re.split(r"\n(?=\S)", text)
    pins = [e for e in entries if re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*==", e)]
    assert pins
    for entry in pins:
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), entry.splitlines()[0]


def test_the_base_images_debian_packages_are_recorded() -> None:
    listed = (ROOT / "deploy" / "image" / "base-packages.list").read_text().splitlines()
    packages = dict(line.split("=", 1) for line in listed if line and not line.startswith("#"))
    assert {"python3", "python3.11", "libstdc++6", "ca-certificates", "dpkg"} <= set(packages)
    assert all(packages.values())
