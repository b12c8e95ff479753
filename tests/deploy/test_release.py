"""Release artefacts: one version (pyproject.toml's) in the chart, its package and the image
tag; the chart package is byte-for-byte the same when made twice, is what Helm loads, and its
checksum file verifies; the locks pin a sha256 for every distribution; the image's commands for
one architecture, and for two published under one tag (a manifest list)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
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


# ---- the image for two architectures under one tag


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), "--dry-run", *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"},
    )  # fmt: skip


def test_one_architecture_is_built_as_before(tmp_path: Path) -> None:
    done = dry_run("--arch", release().host_arch(), "--dist", str(tmp_path))
    assert done.returncode == 0, done.stderr
    version = tool().project_version()
    assert done.stdout.splitlines() == [
        f"IMAGE=localhost/gpuslice:{version} SOURCE_DATE_EPOCH=1700000000 bash "
        "deploy/image/build.sh"
    ]
    assert list(tmp_path.iterdir()) == []  # a dry run makes nothing


def test_two_architectures_are_published_under_one_tag(tmp_path: Path) -> None:
    """An image per architecture, gathered in one manifest list named for the registry,
    pushed with every image it lists; its digest lands beside the other artefacts."""
    repo = "registry.example.com/team/gpuslice"
    done = dry_run("--arch", "amd64,arm64", "--push", repo, "--dist", str(tmp_path))
    assert done.returncode == 0, done.stderr
    v = tool().project_version()
    listed = f"{repo}:{v}"
    assert done.stdout.splitlines() == [
        f"ARCH=amd64 IMAGE=localhost/gpuslice:{v}-amd64 SOURCE_DATE_EPOCH=1700000000 bash "
        "deploy/image/build.sh",
        f"ARCH=arm64 IMAGE=localhost/gpuslice:{v}-arm64 SOURCE_DATE_EPOCH=1700000000 bash "
        "deploy/image/build.sh",
        f"buildah rmi {listed} 2>/dev/null || true",
        f"buildah manifest create {listed}",
        f"buildah manifest add {listed} containers-storage:localhost/gpuslice:{v}-amd64",
        f"buildah manifest add {listed} containers-storage:localhost/gpuslice:{v}-arm64",
        f"buildah manifest push --all --digestfile {tmp_path}/gpuslice-{v}.digest {listed} "
        f"docker://{listed}",
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--arch", "x86_64"],
         "argument --arch: 'x86_64': expected architectures from amd64, arm64"),
        (["--arch", "arm64,arm64"], "comma-separated, once each"),
        (["--push", "registry.example.com/gpuslice:1.0"],
         "no transport, no tag: the tag is the version"),
        (["--push", "docker://registry.example.com/gpuslice"], "no transport, no tag"),
    ],
)  # fmt: skip
def test_a_bad_architecture_or_repository_is_one_line(args: list[str], said: str) -> None:
    done = dry_run(*args)
    assert done.returncode == 2
    assert said in done.stderr.splitlines()[-1]
    assert done.stdout == ""


def test_build_sh_says_what_another_architecture_needs(tmp_path: Path) -> None:
    """Another architecture's packages run their scripts through qemu: without an enabled
    binfmt_misc handler for it the build stops at once, naming the handler and the package."""
    other = "arm64" if release().host_arch() == "amd64" else "amd64"
    handler = "qemu-aarch64" if other == "arm64" else "qemu-x86_64"
    env = {**os.environ, "ARCH": other, "BINFMT_DIR": str(tmp_path)}
    build = ["bash", str(ROOT / "deploy" / "image" / "build.sh")]
    done = subprocess.run(build, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"build.sh: error: building {other} on ")
    assert (
        f"{tmp_path}/{handler} is not an enabled handler: apt-get install qemu-user-static" in line
    )
    (tmp_path / handler).write_text("disabled\ninterpreter /usr/libexec/qemu-binfmt/x\n")
    again = subprocess.run(build, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 1
    assert "is not an enabled handler" in again.stderr
    wrong = subprocess.run(build, env={**env, "ARCH": "s390x"}, capture_output=True, text=True,
                           timeout=60, check=False)  # fmt: skip
    assert (wrong.returncode, wrong.stderr) == (
        2,
        "build.sh: error: ARCH s390x: expected amd64 or arm64\n",
    )


def buildah(*args: str) -> str:
    return subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "BUILDAH_ISOLATION": "chroot"},
    ).stdout  # fmt: skip


def test_the_manifest_steps_gather_both_architectures_and_push_them(tmp_path: Path) -> None:
    """release.py's own manifest commands, run by real buildah over an image of each
    architecture (empty ones standing in for build.sh's), gather both in one list, and its
    push command (to an OCI layout here rather than a registry) sends both with the list."""
    if shutil.which("buildah") is None:
        why = "buildah not installed (apt-get install buildah)"
        if os.environ.get("GPUSLICE_REQUIRE_IMAGE_TEST") == "1":
            pytest.fail(f"GPUSLICE_REQUIRE_IMAGE_TEST=1 but {why}")
        pytest.skip(why)
    rel = release()
    name = f"localhost/gpuslice-release-test-{os.getpid()}"
    digest = tmp_path / "list.digest"
    steps, images, listed = rel.image_steps(
        "0.0.0", ["amd64", "arm64"], 0, image=f"{name}:0.0.0", push=name, digest=digest
    )
    try:
        for arch, image in images.items():
            box = buildah("from", "scratch").strip()
            buildah("config", "--arch", arch, "--os", "linux", box)
            buildah("commit", "--quiet", "--rm", box, image)
        *manifest, push = [step for step in steps if step.argv[0] == "buildah"]
        for step in manifest:
            rel.run_step(step)
        found = json.loads(buildah("manifest", "inspect", listed))["manifests"]
        assert sorted(m["platform"]["architecture"] for m in found) == ["amd64", "arm64"]
        assert push.argv[-1] == f"docker://{listed}"
        rel.run_step(push._replace(argv=[*push.argv[:-1], f"oci:{tmp_path / 'layout'}"]))
        index = json.loads((tmp_path / "layout" / "index.json").read_text())
        (pushed,) = index["manifests"]
        assert pushed["digest"] == digest.read_text().strip()
        blob = tmp_path / "layout" / "blobs" / "sha256" / pushed["digest"].split(":")[1]
        assert len(json.loads(blob.read_text())["manifests"]) == 2
    finally:
        for image in [listed, *images.values()]:
            subprocess.run(["buildah", "rmi", image], capture_output=True, check=False)
