"""The kubelet's pod cgroups on the host, and what the cgroup tree offers for GPU memory
limits (the PodCgroups port).

Pod cgroups sit at fixed QoS levels under either cgroup driver:

  cgroupfs: kubepods/pod<uid>, kubepods/{burstable,besteffort}/pod<uid>
  systemd:  kubepods.slice/kubepods-pod<uid_>.slice,
            kubepods.slice/kubepods-{burstable,besteffort}.slice/kubepods-<qos>-pod<uid_>.slice

`root` is where this process reads the host's cgroup v2 tree; `host_root` is how the
host names it (/sys/fs/cgroup), the form the driver takes a cgroup's path in.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuslice.adapters.cgroups import pod_uid_of
from gpuslice.adapters.outside_files import read_text
from gpuslice.core.isolation import HostFacts, pci_key

HOST_ROOT = "/sys/fs/cgroup"
CGROUP_FILE_MAX_BYTES = 64 << 10
QOS_LEVELS = (
    "kubepods",
    "kubepods/burstable",
    "kubepods/besteffort",
    "kubepods.slice",
    "kubepods.slice/kubepods-burstable.slice",
    "kubepods.slice/kubepods-besteffort.slice",
)
MAX_PODS = 4096  # far more than a node runs (the kubelet's maximum is 110 by default)


class PodCgroupTree:
    def __init__(self, root: str | Path = HOST_ROOT, host_root: str = HOST_ROOT) -> None:
        self.root = Path(root)
        self.host_root = host_root.rstrip("/") or "/"
        self._known: dict[tuple[str, str], str | None] = {}  # (level, name) -> pod UID

    def watched(self) -> tuple[str, ...]:
        return tuple(str(self.root / level) for level in QOS_LEVELS)

    def pods(self) -> dict[str, str]:
        out: dict[str, str] = {}
        known: dict[tuple[str, str], str | None] = {}  # this listing's names only
        for level in QOS_LEVELS:
            try:
                names = os.listdir(self.root / level)
            except OSError:  # this driver's layout, or this QoS level, is absent
                continue
            for name in names[: 4 * MAX_PODS]:
                key = (level, name)
                uid = self._known[key] if key in self._known else pod_uid_of(level.split("/"), name)
                known[key] = uid
                if uid is not None and len(out) < MAX_PODS:
                    out[uid] = f"{self.host_root}/{level}/{name}"
        self._known = known
        return out

    def facts(self, driver: str) -> HostFacts:
        controllers = self._read("cgroup.controllers")
        v2 = controllers is not None
        capacity = self._read("dmem.capacity") or ""
        devices = frozenset(
            pci_key(parts[1])
            for line in capacity.splitlines()
            for parts in (line.split()[0].split("/") if line.strip() else [],)
            if len(parts) == 3 and parts[0] == "nvidia"
        )
        dmem = v2 and "dmem" in (controllers or "").split()
        return HostFacts(cgroup_v2=v2, dmem_controller=dmem, dmem_devices=devices, driver=driver)

    def _read(self, name: str) -> str | None:
        try:
            return read_text(self.root / name, limit=CGROUP_FILE_MAX_BYTES, errors="replace")
        except OSError:
            return None
