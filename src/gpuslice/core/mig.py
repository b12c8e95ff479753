"""MIG values shared by the layout planner and the backends: GPU-instance profiles, their
placements, the instances a GPU holds, the mig-parted config entries, the refusal codes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuslice.core.devices import MigEngines
from gpuslice.core.errors import BackendError

MEMORY_SLICES = 8  # placements are counted in memory slices, 8 per GPU
RESETLESS_ARCHITECTURES = frozenset({"Hopper", "Blackwell"})  # MIG mode toggles without a reset

# NVML's error names, the codes of a MigError.
INSUFFICIENT_RESOURCES = "INSUFFICIENT_RESOURCES"
IN_USE = "IN_USE"
RESET_REQUIRED = "RESET_REQUIRED"
NO_PERMISSION = "NO_PERMISSION"
NOT_FOUND = "NOT_FOUND"
NOT_SUPPORTED = "NOT_SUPPORTED"
INVALID_ARGUMENT = "INVALID_ARGUMENT"

# "1g.5gb", "1g.5gb+me", "1c.3g.20gb": optional compute slices, GPU slices, memory, variants.
PROFILE = re.compile(r"(?:(\d+)c\.)?((\d+)g\.\d+gb(?:[+-][a-z]+)*)")


class MigError(BackendError):
    """The driver refused a MIG call; `code` is NVML's error name (IN_USE, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message}: {code}")
        self.code = code


@dataclass(frozen=True, slots=True, order=True)
class Placement:
    """Where a GPU instance sits: memory slices [start, start + size)."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"{{{self.start},{self.size}}}"


@dataclass(frozen=True, slots=True)
class MigProfileSpec:
    """One GPU-instance profile of a GPU, as NVML's profile info and placements give it."""

    name: str  # "1g.5gb", "1g.5gb+me"
    gi_profile_id: int  # what creation calls take (19 for 1g)
    memory_mib: int
    multiprocessors: int
    slices: int  # GPU (compute) slices: 1, 2, 3, 4 or 7
    instance_count: int  # at most this many at once
    placements: tuple[Placement, ...]
    engines: MigEngines = field(default_factory=MigEngines)


@dataclass(frozen=True, slots=True)
class GpuInstance:
    """A GPU instance with its compute instance, as the driver holds it now."""

    profile: str  # the MIG device's profile: "1g.5gb", or "1c.3g.20gb" for a smaller CI
    placement: Placement
    gi: int
    ci: int = 0  # -1: a GPU instance without a compute instance (a create cut short)
    uuid: str = ""  # the MIG device's UUID ("" without a compute instance)


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """A PCI device ID such as 0x20B010DE (device << 16 | vendor), with an optional
    subsystem ID (subdevice << 16 | subvendor)."""

    device_id: int
    subsystem_id: int | None = None

    def matches(self, device_id: int, subsystem_id: int) -> bool:
        same = device_id == self.device_id
        return same and (self.subsystem_id is None or self.subsystem_id == subsystem_id)


@dataclass(frozen=True, slots=True)
class MigConfigEntry:
    """One entry of a mig-parted config: which GPUs, and the layout they get."""

    devices: tuple[int, ...] | None  # GPU indexes; None: all
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...] = ()  # (profile, count), as written
    device_filter: tuple[DeviceFilter, ...] = ()  # empty: every GPU


def split_profile(name: str) -> tuple[str, int, int]:
    """(GPU-instance profile, compute slices, GPU slices) of a MIG device's profile:
    "1c.3g.20gb" -> ("3g.20gb", 1, 3). ValueError for a name that is not one."""
    match = PROFILE.fullmatch(name)
    if match is None:
        raise ValueError(f"not a MIG profile name: {name!r}")
    slices = int(match[3])
    return match[2], int(match[1] or slices), slices


def mode_change_resets(architecture: str) -> bool:
    """A MIG mode change resets the GPU (Ampere; any architecture not known to toggle
    without one)."""
    return architecture not in RESETLESS_ARCHITECTURES
