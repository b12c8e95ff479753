"""Host facts NVML does not give: sysfs (NUMA node, machine) and procfs (MIG caps).

Every reader takes its root directory, so tests point it at a temporary tree.
"""

from __future__ import annotations

import os
from pathlib import Path

MIG_MINORS = "driver/nvidia-caps/mig-minors"


def normal_bus_id(bus_id: str) -> str:
    """NVML's form: 8-hex-digit domain, upper case ("00000000:07:00.0")."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def _sysfs_device(sys_root: Path, bus_id: str) -> Path:
    """<sys>/bus/pci/devices/<bus ID as sysfs names it> ("0000:07:00.0")."""
    domain, rest = bus_id.split(":", 1)
    return sys_root / "bus/pci/devices" / f"{int(domain, 16):04x}:{rest.lower()}"


def read_numa_node(sys_root: Path, bus_id: str) -> int | None:
    """<sys>/bus/pci/devices/<bus ID as sysfs names it>/numa_node; None when
    unreadable or negative (no NUMA information)."""
    device = _sysfs_device(sys_root, bus_id)
    try:
        node = int((device / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def read_pcie_root(sys_root: Path, bus_id: str) -> str:
    """The PCIe root complex above the device ("pci0000:00"), from the link text of
    <sys>/bus/pci/devices/<bus ID> (../../../devices/pci0000:00/0000:00:01.0/...): the
    link is read, never followed; "" when it is missing or names no root."""
    device = _sysfs_device(sys_root, bus_id)
    try:
        target = os.readlink(device)
    except (OSError, ValueError):
        return ""
    return next((part for part in target.split("/") if part.startswith("pci")), "")


def read_machine(sys_root: Path) -> str:
    """The DMI product name ("DGXA100 920-23687-2530-000"); "" when unreadable."""
    try:
        return (sys_root / "class/dmi/id/product_name").read_text().strip()
    except OSError:
        return ""


def read_mig_minors(proc_root: Path) -> dict[str, int]:
    """Capability name ("gpu0/gi2/ci0/access", keyed by GPU minor) -> the minor
    of its /dev/nvidia-caps/nvidia-cap<N> node; empty when there is no file."""
    try:
        text = (proc_root / MIG_MINORS).read_text()
    except OSError:
        return {}
    fields = (line.split() for line in text.splitlines())
    return {f[0]: int(f[1]) for f in fields if len(f) == 2 and f[1].isdigit()}


def mig_cap_paths(caps: dict[str, int], minor: int, gi: int, ci: int) -> tuple[str, ...] | None:
    """The GI and CI access device nodes of a MIG device; None if either is missing."""
    names = (f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access")
    if any(name not in caps for name in names):
        return None
    return tuple(f"/dev/nvidia-caps/nvidia-cap{caps[name]}" for name in names)
