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
    # Uncached, so that the image is this tree's build and not a layer an older build left in
    # buildah's cache (the reproducibility test compares it with a second build).
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot", "PYTHON": sys.executable, "NO_CACHE": "1"}
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(BUILD)],
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


def test_a_second_build_from_scratch_gives_the_same_image(
    build_output: tuple[str, dict[str, str]],
) -> None:
    """Reproducible: the image stage built again from scratch (a fresh venv, pip installs
    from the hashed wheels, gpuslice's wheel built again) has the same image ID, the digest
    of its config, which names every layer's digest. The base is reused: its Debian packages
    are fixed by deploy/image/base-packages.lock, which build.sh checks when it makes one."""
    stdout, env = build_output
    first = re.search(r"^build\.sh: image (\S+) built in ", stdout, re.MULTILINE)
    assert first, stdout
    again = {**env, "IMAGE": "localhost/gpuslice:reproduced", "NO_CACHE": "1"}
    result = subprocess.run(
        ["bash", str(BUILD)], env=again, capture_output=True, text=True,
        timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    try:
        assert image_id("localhost/gpuslice:reproduced", env) == image_id(first.group(1), env)
    finally:
        subprocess.run(["buildah", "rmi", "localhost/gpuslice:reproduced"], env=env,
                       capture_output=True, check=False)  # fmt: skip


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
