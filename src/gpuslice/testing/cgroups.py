"""A host's cgroup v2 tree in a directory, as the kubelet shapes it under either cgroup
driver and its --cgroup-root: the root's controller and dmem.capacity files, the kubepods
cgroup, pod cgroups made and removed as the kubelet makes and removes them. The
memory-isolation tests, the demo and the bench use it.

The kubelet names a pod's cgroup by its parts, [*cgroup root, "kubepods", qos, "pod<uid>"]
(no qos for guaranteed pods): the cgroupfs driver joins them as directories, the systemd
driver makes one slice per level, each named after every part so far joined by "-" (kind's
kubelet, --cgroup-root=/kubelet: kubelet.slice/kubelet-kubepods.slice/...)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from gpuslice.adapters.fake.profiles import profile_text

R615_DRIVER = "615.10.01"  # a driver with the per-cgroup memory limit calls (CUDA 13.4)
SYSTEMD = "systemd"
CGROUPFS = "cgroupfs"
CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc dmem"


class CgroupTree:
    def __init__(self, root: str | Path, driver: str = SYSTEMD, cgroup_root: str = "/") -> None:
        self.root = Path(root)
        self.driver = driver
        self.cgroup_root = [p for p in cgroup_root.split("/") if p]  # the kubelet's flag

    def _dir(self, *parts: str) -> Path:
        """The directory of the cgroup named by `parts` below the kubelet's cgroup root."""
        names = [*self.cgroup_root, *parts]
        if self.driver == SYSTEMD:  # systemd escapes "-" within a part as "_"
            escaped = [n.replace("-", "_") for n in names]
            names = ["-".join(escaped[: i + 1]) + ".slice" for i in range(len(escaped))]
        return self.root.joinpath(*names)

    def make_kubepods(self) -> Path:
        """What the kubelet makes at its start: the kubepods cgroup and its QoS levels."""
        for qos in ("burstable", "besteffort"):
            self._dir("kubepods", qos).mkdir(parents=True, exist_ok=True)
        return self._dir("kubepods")

    def make_root(
        self, gpu_pci_ids: Iterable[str] = (), *, v2: bool = True, dmem: bool = True
    ) -> None:
        """The root files: cgroup.controllers (absent: not cgroup v2) and dmem.capacity
        with one nvidia/<pci>/vidmem line per GPU."""
        self.root.mkdir(parents=True, exist_ok=True)
        if v2:
            controllers = CONTROLLERS if dmem else CONTROLLERS.replace(" dmem", "")
            (self.root / "cgroup.controllers").write_text(controllers + "\n")
        if dmem:
            lines = [f"nvidia/{_sysfs_pci(p)}/vidmem 16106127360\n" for p in gpu_pci_ids]
            (self.root / "dmem.capacity").write_text("".join(lines))

    def pod_dir(self, uid: str, qos: str = "burstable") -> Path:
        levels = ("kubepods",) if qos == "guaranteed" else ("kubepods", qos)
        return self._dir(*levels, f"pod{uid}")

    def create_pod(self, uid: str, qos: str = "burstable") -> Path:
        """What the kubelet does after admission, before the pod's sandbox."""
        path = self.pod_dir(uid, qos)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def remove_pod(self, uid: str, qos: str = "burstable") -> None:
        path = self.pod_dir(uid, qos)
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        os.rmdir(path)


def _sysfs_pci(bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" as sysfs writes it, "0000:3b:00.0"."""
    parts = bus_id.lower().split(":")
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}" if len(parts) == 3 else bus_id


def r615_node(profile: str, path: str | os.PathLike[str]) -> str:
    """A node file of the built-in `profile` with an r615 driver (the built-in profiles carry
    older drivers, whose simulated NVML cannot set memory limits); its path."""
    text = profile_text(profile)
    text = re.sub(r"(?m)^driver_version: .*$", f'driver_version: "{R615_DRIVER}"', text)
    text = re.sub(r"(?m)^nvml_version: .*$", f'nvml_version: "13.{R615_DRIVER}"', text)
    text = re.sub(r"(?m)^cuda_driver_version: .*$", "cuda_driver_version: 13040", text)
    Path(path).write_text(text, encoding="utf-8")
    return str(path)
