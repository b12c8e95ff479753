"""The container image: deploy/image/build.sh builds it end to end (base from Debian's packages,
then the Dockerfile) and the agent runs inside it: `inspect` and `demo` on simulated hardware,
and `run` with no NVML gives the one-line error naming both ways to bring NVML in.

Needs buildah and mmdebstrap as root. CI (.ci/run) installs them and sets
GPUSLICE_REQUIRE_IMAGE_TEST=1, so there a missing tool fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "image" / "build.sh"
EXAMPLES = "/usr/share/gpuslice/examples"
REQUIRED = os.environ.get("GPUSLICE_REQUIRE_IMAGE_TEST") == "1"
BUILD_TIMEOUT_S = 1200
# What buildah itself says on stderr when the command it ran exits non-zero.
BUILDAH_NOISE = re.compile(r"^(subprocess exited with status \d+|Error: exit status \d+)$")

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 300)


def _missing() -> str | None:
    tools = [t for t in ("buildah", "mmdebstrap") if shutil.which(t) is None]
    if tools:
        return f"{' and '.join(tools)} not installed (apt-get install buildah mmdebstrap)"
    if os.geteuid() != 0:
        return "building the base image needs root"
    return None


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def own_stderr(self) -> list[str]:
        """stderr without buildah's own lines about the exit status."""
        return [ln for ln in self.stderr.splitlines() if not BUILDAH_NOISE.match(ln)]


class Container:
    """A working container of the image; `run` executes the image's entrypoint in it."""

    def __init__(self, image: str, env: dict[str, str]) -> None:
        self.env = env
        inspected = self._buildah("inspect", "--type", "image", image)
        self.config: dict[str, Any] = json.loads(inspected)["OCIv1"]["config"]
        self.name = self._buildah("from", "--pull-never", image).strip()

    def _buildah(self, *args: str) -> str:
        return subprocess.run(
            ["buildah", *args], env=self.env, check=True, capture_output=True, text=True
        ).stdout

    def python(self, code: str) -> str:
        return self._buildah("run", self.name, "--", "/opt/gpuslice/bin/python", "-c", code)

    def run(self, *args: str, user: str = "0:0", volumes: tuple[str, ...] = ()) -> Run:
        options = ["--user", user]
        for volume in volumes:
            options += ["--volume", volume]
        argv = ["buildah", "run", *options, self.name, "--", *self.config["Entrypoint"], *args]
        result = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=120, check=False
        )
        return Run(result.returncode, result.stdout, result.stderr)

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], env=self.env, capture_output=True, check=False)


@pytest.fixture(scope="module")
def build_output() -> tuple[str, dict[str, str]]:
    missing = _missing()
    if missing is not None:
        if REQUIRED:
            pytest.fail(f"GPUSLICE_REQUIRE_IMAGE_TEST=1 but {missing}")
        pytest.skip(missing)
    # Uncached, so that the base and the image are this tree's build and not an older build's
    # (the reproducibility test compares them with a second build).
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot", "PYTHON": sys.executable, "NO_CACHE": "1"}
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(BUILD), "--rebuild-base"],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, f"build.sh failed:\n{result.stdout}\n{result.stderr[-4000:]}"
    print(f"\n{result.stdout.strip()}\nbuild.sh took {took:.1f} s in all")
    return result.stdout, env


@pytest.fixture(scope="module")
def container(build_output: tuple[str, dict[str, str]]) -> Iterator[Container]:
    stdout, env = build_output
    built = re.search(r"^build\.sh: image (\S+) built in ", stdout, re.MULTILINE)
    assert built, stdout
    box = Container(built.group(1), env)
    yield box
    box.remove()


def image_id(image: str, env: dict[str, str]) -> str:
    return subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
        env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def labels(image: str, env: dict[str, str]) -> dict[str, str]:
    inspected = subprocess.run(
        ["buildah", "inspect", "--type", "image", image],
        env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    found: dict[str, str] = json.loads(inspected)["OCIv1"]["config"].get("Labels") or {}
    return found


def recorded(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]


def test_two_builds_in_one_run_give_one_digest_and_a_changed_package_set_only_reports(
    build_output: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """Reproducible as Debian's archive allows: the base made again from Debian's packages and
    the image stage built again from scratch (a fresh venv, pip installs from the hashed
    wheels, gpuslice's wheel built again) give the same base and image IDs (the digests of
    their configs, which name every layer's digest). A recorded package list that differs from
    what Debian serves today is reported with the command that records it and fails nothing;
    that command (--refresh-base) writes the list the base got."""
    stdout, env = build_output
    first = re.search(r"^build\.sh: image (\S+) built in ", stdout, re.MULTILINE)
    assert first, stdout
    stale = tmp_path / "base-packages.list"
    listed = recorded(ROOT / "deploy" / "image" / "base-packages.list")
    stale.write_text("# header kept\n" + "\n".join([*listed[1:], "zz-gone-package=1.0"]) + "\n")
    base = {**env, "BASE_PACKAGES_LIST": str(stale)}
    reported = subprocess.run(
        ["bash", str(BUILD)], env=base, capture_output=True, text=True,
        timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert reported.returncode == 0, reported.stderr[-4000:]
    assert "differ from those last recorded" in reported.stdout
    assert "build.sh:   < zz-gone-package=1.0" in reported.stdout
    assert "deploy/image/build.sh --refresh-base" in reported.stdout

    base_image = "localhost/gpuslice-base:bookworm"
    first_base = image_id(base_image, env)
    again = {**base, "IMAGE": "localhost/gpuslice:reproduced"}
    result = subprocess.run(
        ["bash", str(BUILD), "--refresh-base"], env=again, capture_output=True, text=True,
        timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    try:
        assert re.search(r"^build\.sh: base \S+ built in ", result.stdout, re.MULTILINE)
        assert image_id(base_image, env) == first_base
        assert image_id("localhost/gpuslice:reproduced", env) == image_id(first.group(1), env)
        got = labels(base_image, env)["io.gpuslice.base-packages"]
        assert recorded(stale) == got.split(" ")
        assert stale.read_text().startswith("# header kept\n")
    finally:
        subprocess.run(["buildah", "rmi", "localhost/gpuslice:reproduced"], env=env,
                       capture_output=True, check=False)  # fmt: skip


def test_the_image_records_the_debian_packages_it_got(container: Container) -> None:
    """The exact package list, in the image and as a label, is what dpkg says is installed."""
    status = container.python(
        "import re; t = open('/var/lib/dpkg/status').read(); "
        "print(*sorted({p + '=' + v for p, v in re.findall("
        "r'^Package: (\\S+)\\n(?:.+\\n)*?Version: (\\S+)', t, re.M)}, key=str.encode))"
    ).split()
    listed = container.python("print(open('/usr/share/gpuslice/base-packages.list').read())")
    assert listed.split() == status
    assert container.config["Labels"]["io.gpuslice.base-packages"].split(" ") == status
    assert {"python3", "libstdc++6", "ca-certificates"} <= {p.split("=")[0] for p in status}


def test_the_script_reports_build_time_and_size(build_output: tuple[str, dict[str, str]]) -> None:
    stdout, _ = build_output
    assert re.search(r"^build\.sh: base \S+ (present|built in [\d.]+ s)$", stdout, re.MULTILINE)
    assert re.search(r"built in [\d.]+ s, size [\d.]+ [kMG]?B$", stdout, re.MULTILINE), stdout


def test_the_image_config_fits_a_daemonset(container: Container) -> None:
    """Entrypoint gpuslice (run by default), OCI labels, no HEALTHCHECK (kubelet probes)."""
    config = container.config
    assert config["Entrypoint"] == ["/opt/gpuslice/bin/gpuslice"]
    assert config["Cmd"] == ["run"]
    assert "Healthcheck" not in config
    labels = config["Labels"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"] == "gpuslice"
    for key in ("source", "revision", "description"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in config["Env"]


def test_only_the_locked_runtime_dependencies_are_installed(container: Container) -> None:
    lock = {
        line.split("==")[0].strip().lower().replace("_", "-")
        for line in (ROOT / "requirements" / "runtime.lock").read_text().splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }
    listing = container.python(
        "import importlib.metadata as m; print(*(d.metadata['Name'] for d in m.distributions()))"
    )
    installed = {name.lower().replace("_", "-") for name in listing.split()}
    assert installed == lock | {"gpuslice"}  # no pip, no test or build tools


def test_inspect_on_a_simulated_t4x4_node(container: Container) -> None:
    result = container.run(
        "inspect",
        "--fake-hardware",
        "t4x4",
        "--config-file",
        f"{EXAMPLES}/time-slicing.yaml",
        "--output",
        "json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["resources"] == {"nvidia.com/gpu": 16}
    assert report["labels"]["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert report["labels"]["nvidia.com/gpu.replicas"] == "4"


def test_inspect_runs_as_a_non_root_user(container: Container) -> None:
    """The layout is readable by any uid: only the kubelet's directory asks for root."""
    result = container.run(
        "inspect",
        "--fake-hardware",
        "t4x4",
        "--config-file",
        f"{EXAMPLES}/time-slicing.yaml",
        user="65532:65532",
    )
    assert result.returncode == 0, result.stderr
    assert "nvidia.com/gpu" in result.stdout
    assert "Traceback" not in result.stderr


def test_demo(container: Container) -> None:
    result = container.run("demo")
    assert result.returncode == 0, result.stderr
    assert "XID 79" in result.stdout
    assert "plugin sockets left behind: none" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("mount", "where"),
    [
        (False, "/driver-root is not mounted"),
        (True, "is neither on the library path nor under /driver-root"),
    ],
)
def test_run_without_nvml_names_the_runtime_class_and_the_driver_root(
    container: Container, tmp_path: Path, mount: bool, where: str
) -> None:
    """What a pod started without the NVIDIA runtime and without the driver root prints."""
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    volumes = [f"{plugins}:/var/lib/kubelet/device-plugins"]  # as the DaemonSet mounts it
    if mount:
        (tmp_path / "driver-root").mkdir()
        volumes.append(f"{tmp_path / 'driver-root'}:/driver-root:ro")
    result = container.run("run", volumes=tuple(volumes))
    assert result.returncode == 1, result.stderr
    lines = result.own_stderr
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("gpuslice: error: NVML could not be loaded: libnvidia-ml.so.1 ")
    assert where in line
    assert "runtimeClassName: nvidia" in line
    assert "nvidiaDriverRoot" in line
