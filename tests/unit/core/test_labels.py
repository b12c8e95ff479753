"""Node-wide GFD labels: timestamp, machine, versions, capabilities, mode, helpers."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.errors import HardwareError
from gpuslice.core.labels import (
    TIMESTAMP_LABEL,
    family,
    label_node,
    labels_changed,
    node_labels,
    sanitise,
    with_timestamp,
)
from gpuslice.core.sharing import MIG_NONE, MPS, TIME_SLICING, ReplicaRule, ResourceSettings

from . import builders as b

GPU_RULE = ReplicaRule("nvidia.com/gpu", 4)


def labels_of(
    snapshot: HardwareSnapshot, settings: ResourceSettings | None = None
) -> dict[str, str]:
    return node_labels(snapshot, settings or ResourceSettings())


def node(*gpus: Gpu, **fields: Any) -> HardwareSnapshot:
    """A snapshot of `gpus` (one A100 when none), with snapshot `fields` replaced."""
    return replace(b.snapshot(*(gpus or (b.gpu(0),))), **fields)


# --- sanitising and families -------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA GeForce RTX 3090 (Ti)", "NVIDIA-GeForce-RTX-3090-Ti"),
        ("  padded   words  ", "padded-words"),
        ("a\tb+c/d", "abcd"),
        ("g4dn.xlarge", "g4dn.xlarge"),
        ("under_score", "under_score"),
        ("", ""),
    ],
)
def test_sanitise_drops_unsafe_characters_and_joins_words_with_dashes(raw: str, clean: str) -> None:
    assert sanitise(raw) == clean


@given(st.text())
def test_sanitised_values_hold_only_label_value_characters(raw: str) -> None:
    """Whatever a product or machine name holds, the label value is [A-Za-z0-9-_.]*."""
    out = sanitise(raw)
    assert all(c.isascii() and (c.isalnum() or c in "-_.") for c in out)


@pytest.mark.parametrize(
    ("cc", "name"),
    [
        ((1, 3), "tesla"),
        ((2, 1), "fermi"),
        ((3, 7), "kepler"),
        ((4, 0), "undefined"),
        ((5, 2), "maxwell"),
        ((6, 1), "pascal"),
        ((7, 0), "volta"),
        ((7, 2), "volta"),
        ((7, 4), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 8), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((11, 0), "undefined"),
        ((12, 0), "blackwell"),
        ((13, 0), "rubin"),
        ((14, 0), "undefined"),
    ],
)
def test_family_follows_upstream_mapping_at_every_boundary(cc: tuple[int, int], name: str) -> None:
    assert family(*cc) == name


def test_compute_and_family_labels_come_from_the_compute_capability() -> None:
    got = labels_of(node(replace(b.gpu(0), compute_capability=(7, 5))))
    assert got["nvidia.com/gpu.family"] == "turing"
    assert (got["nvidia.com/gpu.compute.major"], got["nvidia.com/gpu.compute.minor"]) == ("7", "5")


def test_compute_major_zero_leaves_out_family_and_compute_labels() -> None:
    got = labels_of(node(replace(b.gpu(0), compute_capability=(0, 0))))
    assert not {"nvidia.com/gpu.family", "nvidia.com/gpu.compute.major"} & got.keys()
    assert "nvidia.com/gpu.compute.minor" not in got


def test_memory_is_mib_and_left_out_when_zero() -> None:
    assert labels_of(node(b.gpu(0, memory_mib=15360)))["nvidia.com/gpu.memory"] == "15360"
    assert "nvidia.com/gpu.memory" not in labels_of(node(b.gpu(0, memory_mib=0)))


# --- timestamp and machine ---------------------------------------------------------------


def test_timestamp_is_unix_seconds_and_absent_when_not_given() -> None:
    snap = node()
    assert node_labels(snap, ResourceSettings(), timestamp=1724632719)[TIMESTAMP_LABEL] == (
        "1724632719"
    )
    assert TIMESTAMP_LABEL not in node_labels(snap, ResourceSettings())


def test_machine_defaults_to_the_snapshot_and_is_sanitised() -> None:
    snap = node(machine="DGXA100 920-23687-2530-000")
    assert labels_of(snap)["nvidia.com/gpu.machine"] == "DGXA100-920-23687-2530-000"
    given_name = node_labels(snap, ResourceSettings(), machine="NVIDIA DGX-2H")
    assert given_name["nvidia.com/gpu.machine"] == "NVIDIA-DGX-2H"


@pytest.mark.parametrize("machine", ["", "  ", "()"])
def test_machine_is_unknown_when_empty_after_sanitising(machine: str) -> None:
    assert labels_of(node(machine=machine))["nvidia.com/gpu.machine"] == "unknown"


# --- versions ----------------------------------------------------------------------------


def test_driver_version_labels_in_both_forms() -> None:
    got = labels_of(node(driver_version="550.107.02"))
    for old, new, value in (("major", "major", "550"), ("minor", "minor", "107")):
        assert got[f"nvidia.com/cuda.driver.{old}"] == got[f"nvidia.com/cuda.driver-version.{new}"]
        assert got[f"nvidia.com/cuda.driver.{old}"] == value
    assert got["nvidia.com/cuda.driver.rev"] == "02"
    assert got["nvidia.com/cuda.driver-version.revision"] == "02"
    assert got["nvidia.com/cuda.driver-version.full"] == "550.107.02"


def test_two_part_driver_version_has_an_empty_revision() -> None:
    got = labels_of(node(driver_version="535.54"))
    assert got["nvidia.com/cuda.driver.rev"] == got["nvidia.com/cuda.driver-version.revision"] == ""
    assert got["nvidia.com/cuda.driver-version.full"] == "535.54"


@pytest.mark.parametrize("version", ["550", "1.2.3.4", "550..02", "550.54.15-beta", "r550 54"])
def test_malformed_driver_version_is_a_one_line_hardware_error(version: str) -> None:
    with pytest.raises(HardwareError, match=r"driver version .* does not match X\.Y\[\.Z\]") as err:
        labels_of(node(driver_version=version))
    assert "\n" not in str(err.value)


def test_unreported_versions_leave_their_labels_out() -> None:
    got = labels_of(node(driver_version="", cuda_driver_version=0))
    assert not [k for k in got if k.startswith("nvidia.com/cuda.")]


@pytest.mark.parametrize(
    ("nvml", "major", "minor"), [(12040, 12, 4), (11080, 11, 8), (12000, 12, 0)]
)
def test_runtime_version_decodes_nvmls_cuda_driver_version(
    nvml: int, major: int, minor: int
) -> None:
    got = labels_of(node(cuda_driver_version=nvml))
    assert got["nvidia.com/cuda.runtime.major"] == got["nvidia.com/cuda.runtime-version.major"]
    assert got["nvidia.com/cuda.runtime.minor"] == got["nvidia.com/cuda.runtime-version.minor"]
    assert got["nvidia.com/cuda.runtime.major"] == str(major)
    assert got["nvidia.com/cuda.runtime.minor"] == str(minor)
    assert got["nvidia.com/cuda.runtime-version.full"] == f"{major}.{minor}"


# --- capabilities and mode ---------------------------------------------------------------


def test_mig_capable_when_any_gpu_is() -> None:
    t4 = replace(b.gpu(0, name="Tesla T4"), mig_capable=False)
    assert labels_of(node(t4))["nvidia.com/mig.capable"] == "false"
    assert labels_of(node(t4, b.gpu(1)))["nvidia.com/mig.capable"] == "true"


def mps(rules: tuple[ReplicaRule, ...] = (GPU_RULE,)) -> ResourceSettings:
    return b.settings(MIG_NONE, *rules, strategy=MPS)


def test_mps_capable_only_under_mps() -> None:
    assert labels_of(node(), mps())["nvidia.com/mps.capable"] == "true"
    time_sliced = b.settings(MIG_NONE, GPU_RULE, strategy=TIME_SLICING)
    assert labels_of(node(), time_sliced)["nvidia.com/mps.capable"] == "false"
    assert labels_of(node())["nvidia.com/mps.capable"] == "false"


def test_mps_with_mig_enabled_labels_false_and_warns() -> None:
    """Upstream's labeller fails here; we keep labelling and say why."""
    result = label_node(node(b.gpu(0), b.gpu(1, profiles=["1g.5gb"])), mps())
    assert result.labels["nvidia.com/mps.capable"] == "false"
    assert any("MIG enabled (GPU 1)" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("classes", "mode"),
    [
        ((0x030200,), "compute"),
        ((0x030200, 0x030200), "compute"),
        ((0x030000,), "graphics"),
        ((0x030000, 0x030200), "unknown"),
        ((0x038000,), "unknown"),
    ],
)
def test_gpu_mode_from_the_pci_class_of_every_gpu(classes: tuple[int, ...], mode: str) -> None:
    gpus = [replace(b.gpu(i), pci_class=c) for i, c in enumerate(classes)]
    assert labels_of(node(*gpus))["nvidia.com/gpu.mode"] == mode


def test_vgpu_present_is_false() -> None:
    assert labels_of(node())["nvidia.com/vgpu.present"] == "false"


# --- whole-node shape --------------------------------------------------------------------


def test_node_without_gpus_gets_only_the_timestamp_and_a_warning() -> None:
    result = label_node(HardwareSnapshot(gpus=()), ResourceSettings(), timestamp=5)
    assert result.labels == {TIMESTAMP_LABEL: "5"}
    assert result.warnings


def test_labels_come_sorted_by_key() -> None:
    keys = list(node_labels(node(), ResourceSettings(), timestamp=1))
    assert keys == sorted(keys)


def test_unknown_mig_strategy_is_a_hardware_error() -> None:
    with pytest.raises(HardwareError, match="unknown MIG strategy 'both'"):
        labels_of(node(), ResourceSettings(mig_strategy="both"))


# --- change detection and timestamps -----------------------------------------------------

BASE = {"nvidia.com/gpu.count": "1", TIMESTAMP_LABEL: "100"}


def test_a_new_timestamp_alone_is_no_change() -> None:
    assert not labels_changed(BASE, {**BASE, TIMESTAMP_LABEL: "160"})
    assert not labels_changed(BASE, {"nvidia.com/gpu.count": "1"})


@pytest.mark.parametrize(
    "new",
    [
        {"nvidia.com/gpu.count": "2", TIMESTAMP_LABEL: "100"},
        {TIMESTAMP_LABEL: "100"},
        {**BASE, "nvidia.com/gpu.replicas": "4"},
    ],
)
def test_any_other_difference_is_a_change(new: dict[str, str]) -> None:
    assert labels_changed(BASE, new)


def test_no_previous_labels_is_a_change_and_ignore_is_configurable() -> None:
    assert labels_changed(None, BASE)
    assert not labels_changed(BASE, {TIMESTAMP_LABEL: "100"}, ignore=("nvidia.com/gpu.count",))


def test_with_timestamp_keeps_the_previous_stamp_while_nothing_else_changes() -> None:
    first = with_timestamp({"nvidia.com/gpu.count": "1"}, 100, None)
    assert first == BASE
    assert with_timestamp({"nvidia.com/gpu.count": "1"}, 160, first) == first
    changed = with_timestamp({"nvidia.com/gpu.count": "2"}, 220, first)
    assert changed[TIMESTAMP_LABEL] == "220"


def test_with_timestamp_stamps_now_when_the_previous_labels_had_none() -> None:
    got = with_timestamp({"nvidia.com/gpu.count": "1"}, 7, {"nvidia.com/gpu.count": "1"})
    assert got[TIMESTAMP_LABEL] == "7"
