"""The what-if commands refuse what `gpuslice run` refuses on the same hardware: they
share the agent's check (core.mps.plan_serving), so a config that would stop every
agent never passes `inspect` or `labels`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from node_harness import time_slicing
from process_harness import GPUSLICE, clean_env

MPS_64 = time_slicing(64).replace("timeSlicing", "mps")
MPS_2 = MPS_64.replace("replicas: 64", "replicas: 2")


def gpuslice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUSLICE, *args], capture_output=True, text=True, env=clean_env(), timeout=60,
        check=False,
    )  # fmt: skip


def refused(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if "error" in ln]
    assert lines, result.stderr
    return lines[-1]


@pytest.fixture
def mps_root(tmp_path: Path) -> str:
    return str(tmp_path / "mps")


def test_inspect_refuses_more_mps_clients_than_a_gpu_takes(tmp_path: Path, mps_root: str) -> None:
    config = tmp_path / "mps.yaml"
    config.write_text(MPS_64)
    args = ["inspect", "--fake-hardware", "a100-40gb", "--config-file", str(config)]
    line = refused(gpuslice(*args, "--mps-root", mps_root))
    assert "64 replicas of GPU 0" in line
    assert "MPS allows at most 48 clients per GPU" in line


def test_inspect_refuses_a_pinned_limit_above_the_gpus_memory(
    tmp_path: Path, mps_root: str
) -> None:
    config = tmp_path / "mps.yaml"
    config.write_text(MPS_2)
    args = ["inspect", "--fake-hardware", "t4", "--config-file", str(config)]
    line = refused(gpuslice(*args, "--mps-root", mps_root, "--mps-pinned-memory-limit", "20000"))
    assert "--mps-pinned-memory-limit 20000 (MiB)" in line
    assert "15360 MiB" in line


def test_an_absurd_pinned_limit_is_refused_at_the_flag(tmp_path: Path) -> None:
    line = refused(
        gpuslice("inspect", "--fake-hardware", "t4", "--mps-pinned-memory-limit", "1" + "0" * 20)
    )
    assert "--mps-pinned-memory-limit" in line
    assert "expected an integer from 0 to 2147483647" in line


def test_labels_refuse_mps_on_mig_devices(tmp_path: Path, mps_root: str) -> None:
    """Labelled as sharing-strategy none and exit 0 before; `run` refuses it."""
    config = tmp_path / "mps.yaml"
    config.write_text(MPS_2)
    out = tmp_path / "labels"
    args = [
        "labels",
        "--oneshot",
        "--fake-hardware",
        "a100-40gb-mig-mixed",
        "--use-node-feature-api=false",
    ]
    result = gpuslice(
        *args, "--config-file", str(config), "--mps-root", mps_root, "--output-file", str(out)
    )
    line = refused(result)
    assert "MIG" in line
    assert not out.exists() or "sharing-strategy=none" not in out.read_text()


def test_inspect_says_when_the_toolkits_cdi_spec_is_missing(tmp_path: Path) -> None:
    config = tmp_path / "cdi.yaml"
    config.write_text("version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\n")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    args = ["inspect", "--fake-hardware", "t4", "--config-file", str(config), "--output", "json"]
    result = gpuslice(*args, "--cdi-spec-dir", str(cdi))
    assert result.returncode == 0, result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert [w for w in warnings if w.startswith(f"no CDI spec of kind nvidia.com/gpu in {cdi}")]
    (cdi / "nvidia.yaml").write_text("kind: nvidia.com/gpu\ndevices:\n- name: all\n")
    result = gpuslice(*args, "--cdi-spec-dir", str(cdi))
    assert not [w for w in json.loads(result.stdout)["warnings"] if "nvidia.com/gpu in" in w]
