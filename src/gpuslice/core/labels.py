"""Node labels as NVIDIA's GPU Feature Discovery (GFD) publishes them.

node_labels() gives the whole catalogue for a hardware snapshot and the resource
settings; the per-resource groups live in label_groups. Pure: the machine type and the
timestamp are passed in. docs/labels.md lists every label and where we differ.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpuslice.core import strategies
from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.errors import HardwareError
from gpuslice.core.label_groups import family, resource_labels, sanitise
from gpuslice.core.sharing import ResourceSettings

__all__ = [
    "TIMESTAMP_LABEL",
    "NodeLabels",
    "family",
    "label_node",
    "labels_changed",
    "node_labels",
    "sanitise",
    "with_timestamp",
]

TIMESTAMP_LABEL = "nvidia.com/gfd.timestamp"
UNKNOWN = "unknown"
PCI_CLASS_COMPUTE = 0x030200  # 3D controller
PCI_CLASS_GRAPHICS = 0x030000  # VGA controller

_VERSION_PART = re.compile(r"[0-9A-Za-z]+")


@dataclass(frozen=True, slots=True)
class NodeLabels:
    labels: dict[str, str]
    warnings: tuple[str, ...] = ()  # what upstream would log while labelling


def node_labels(
    snapshot: HardwareSnapshot,
    settings: ResourceSettings,
    *,
    machine: str | None = None,
    timestamp: int | None = None,
) -> dict[str, str]:
    """Every GFD label of the node, sorted by key. `machine` is the machine type (the DMI
    product name; None takes the snapshot's); `timestamp` (Unix seconds) is left out when
    None. Raises HardwareError for a malformed driver version or an unknown MIG strategy."""
    return label_node(snapshot, settings, machine=machine, timestamp=timestamp).labels


def label_node(
    snapshot: HardwareSnapshot,
    settings: ResourceSettings,
    *,
    machine: str | None = None,
    timestamp: int | None = None,
    more: Mapping[str, str] | None = None,
) -> NodeLabels:
    """node_labels() with the warnings met on the way (several GPU models, an invalid
    single-strategy MIG layout, an empty MIG-enabled GPU under the mixed strategy, MPS
    asked for on a node with MIG enabled), and `more`, the agent's own labels beside
    GFD's (core.isolation.labels). The labeller and `gpuslice inspect` both label here."""
    warnings: list[str] = []
    labels: dict[str, str] = {}
    if timestamp is not None:
        labels[TIMESTAMP_LABEL] = str(timestamp)
    gpus = snapshot.gpus
    if not gpus:
        warnings.append("no GPUs found; only the timestamp is labelled")
        return NodeLabels(labels, tuple(warnings))
    name = snapshot.machine if machine is None else machine
    labels["nvidia.com/gpu.machine"] = sanitise(name) or UNKNOWN
    labels |= _version_labels(snapshot)
    labels["nvidia.com/mig.capable"] = _flag(any(g.mig_capable for g in gpus))
    serving = settings.sharing.serving
    for strategy in strategies.STRATEGIES:  # each capable label: true only for the one in force
        if strategy.capable_label:
            capable = strategy is serving and strategy.capable(gpus, warnings.append)
            labels[strategy.capable_label] = _flag(capable)
    labels["nvidia.com/gpu.mode"] = _mode(gpus)
    labels["nvidia.com/vgpu.present"] = "false"
    labels |= resource_labels(gpus, settings, warnings.append)
    labels |= more or {}
    return NodeLabels(dict(sorted(labels.items())), tuple(warnings))


def labels_changed(
    old: Mapping[str, str] | None,
    new: Mapping[str, str],
    ignore: Collection[str] = (TIMESTAMP_LABEL,),
) -> bool:
    """True when the labels differ in anything but the `ignore`d keys (None: no old labels)."""
    if old is None:
        return True
    return {k: v for k, v in old.items() if k not in ignore} != {
        k: v for k, v in new.items() if k not in ignore
    }


def with_timestamp(
    labels: Mapping[str, str], now: int, previous: Mapping[str, str] | None
) -> dict[str, str]:
    """`labels` stamped with `now`, or with the previous stamp when nothing else changed,
    so an unchanged node is not rewritten only because time passed."""
    stamp = str(now)
    if (
        previous is not None
        and TIMESTAMP_LABEL in previous
        and not labels_changed(previous, labels)
    ):
        stamp = previous[TIMESTAMP_LABEL]
    return dict(sorted({**labels, TIMESTAMP_LABEL: stamp}.items()))


def _version_labels(snapshot: HardwareSnapshot) -> dict[str, str]:
    """cuda.driver(-version).* from the driver version and cuda.runtime(-version).* from
    the CUDA version the driver supports; each group is left out when not reported."""
    labels: dict[str, str] = {}
    version = snapshot.driver_version
    if version:
        parts = version.split(".")
        if not 2 <= len(parts) <= 3 or not all(_VERSION_PART.fullmatch(p) for p in parts):
            raise HardwareError(
                f"driver version {version!r} does not match X.Y[.Z] (letters and digits)"
            )
        major, minor, rev = (*parts, "")[:3]
        for old, new, value in (
            ("major", "major", major),
            ("minor", "minor", minor),
            ("rev", "revision", rev),
        ):
            labels[f"nvidia.com/cuda.driver.{old}"] = value
            labels[f"nvidia.com/cuda.driver-version.{new}"] = value
        labels["nvidia.com/cuda.driver-version.full"] = version
    cuda = snapshot.cuda_driver_version
    if cuda:
        # NVML's encoding: 1000 * major + 10 * minor (12040 is 12.4).
        cuda_major, cuda_minor = cuda // 1000, cuda % 1000 // 10
        for suffix, number in (("major", cuda_major), ("minor", cuda_minor)):
            labels[f"nvidia.com/cuda.runtime.{suffix}"] = str(number)
            labels[f"nvidia.com/cuda.runtime-version.{suffix}"] = str(number)
        labels["nvidia.com/cuda.runtime-version.full"] = f"{cuda_major}.{cuda_minor}"
    return labels


def _mode(gpus: tuple[Gpu, ...]) -> str:
    """compute or graphics when every GPU has that PCI class, else unknown."""
    classes = {g.pci_class for g in gpus}
    if classes == {PCI_CLASS_COMPUTE}:
        return "compute"
    if classes == {PCI_CLASS_GRAPHICS}:
        return "graphics"
    return UNKNOWN


def _flag(value: bool) -> str:
    return "true" if value else "false"
