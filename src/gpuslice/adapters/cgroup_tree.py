"""The kubelet's pod cgroups on the host, and what the cgroup tree offers for GPU memory
limits (the PodCgroups port).

Pod cgroups sit at fixed QoS levels below the kubelet's kubepods cgroup, under either
cgroup driver:

  cgroupfs: kubepods/pod<uid>, kubepods/{burstable,besteffort}/pod<uid>
  systemd:  kubepods.slice/kubepods-pod<uid_>.slice,
            kubepods.slice/kubepods-{burstable,besteffort}.slice/kubepods-<qos>-pod<uid_>.slice

The kubepods cgroup is at the root by default. A kubelet with a --cgroup-root puts it lower
(/kubelet/kubepods; under systemd kubelet.slice/kubelet-kubepods.slice, whose levels take
the prefix: kubelet-kubepods-burstable.slice, as under kind), so it is searched for: breadth
first from the root, links not followed, at most MAX_DEPTH levels and MAX_ENTRIES entries,
stopping at the first level that has one. Those found are kept while they exist.

`root` is where this process reads the host's cgroup v2 tree; `host_root` is how the
host names it (/sys/fs/cgroup), the form the driver takes a cgroup's path in.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuslice.adapters.cgroups import pod_uid_of
from gpuslice.adapters.outside_files import read_text
from gpuslice.core.isolation import HostFacts, pci_key

HOST_ROOT = "/sys/fs/cgroup"
CGROUP_FILE_MAX_BYTES = 64 << 10
DEFAULT_ROOTS = ("kubepods", "kubepods.slice")  # the kubelet's default --cgroup-root "/"
MAX_DEPTH = 6  # kubepods' depth: 1 by default, 2 under kind, 1 + a --cgroup-root's parts
MAX_ENTRIES = 50_000  # directory entries read by one search (a host has a few thousand)
MAX_PODS = 4096  # far more than a node runs (the kubelet's maximum is 110 by default)
QOS = ("burstable", "besteffort")


def qos_levels(root: str) -> tuple[str, ...]:
    """The directories pod cgroups sit in below the kubepods cgroup `root` (relative)."""
    name = root.rsplit("/", 1)[-1]
    if name.endswith(".slice"):  # systemd: "<p>kubepods.slice" -> "<p>kubepods-<qos>.slice"
        return (root, *(f"{root}/{name[: -len('.slice')]}-{q}.slice" for q in QOS))
    return (root, *(f"{root}/{q}" for q in QOS))


def is_kubepods(parent: str, name: str) -> bool:
    """Whether directory `name` in `parent` is a kubelet's kubepods cgroup."""
    if name in DEFAULT_ROOTS:
        return True
    prefix = name.removesuffix("kubepods.slice")  # systemd: "kubelet-" in kubelet.slice
    return name.endswith("-kubepods.slice") and parent == f"{prefix[:-1]}.slice"


def find_kubepods(root: Path) -> tuple[tuple[str, ...], str]:
    """(the kubepods cgroups found, relative to `root`, shallowest level only; "" or
    one line saying what was searched when none is)."""
    try:
        os.scandir(root).close()
    except OSError as exc:
        return (), f"the cgroup tree at {root} cannot be read ({exc.strerror}): no pod is limited"
    level, read, depth = [""], 0, 0
    while level and depth < MAX_DEPTH and read <= MAX_ENTRIES:
        found: list[str] = []
        below: list[str] = []
        for rel in level:
            if read > MAX_ENTRIES:
                break
            parent = rel.rsplit("/", 1)[-1]
            try:
                with os.scandir(root / rel) as entries:
                    for entry in entries:
                        read += 1
                        if read > MAX_ENTRIES:
                            break
                        if entry.is_dir(follow_symlinks=False):
                            path = f"{rel}/{entry.name}" if rel else entry.name
                            (found if is_kubepods(parent, entry.name) else below).append(path)
            except OSError:  # gone, or not readable: searched no further there
                continue
        depth += 1
        if found:
            return tuple(sorted(found)), ""
        level = below
    cut = f", stopped at {MAX_ENTRIES} entries" if read > MAX_ENTRIES else ""
    return (), (
        "no kubepods cgroup (kubepods, kubepods.slice or <prefix>-kubepods.slice) under "
        f"{root}, searched {depth} levels deep without following links{cut}: no pod is limited"
    )


class PodCgroupTree:
    def __init__(self, root: str | Path = HOST_ROOT, host_root: str = HOST_ROOT) -> None:
        self.root = Path(root)
        self.host_root = host_root.rstrip("/") or "/"
        self._known: dict[tuple[str, str], str | None] = {}  # (level, name) -> pod UID
        self._roots: tuple[str, ...] = ()
        self._missing = ""

    def where(self) -> str:
        return f"this machine's cgroup tree at {self.root}"

    def kubepods(self) -> tuple[str, ...]:
        """The kubepods cgroups (host paths) found by the last watched() or pods()."""
        return tuple(f"{self.host_root}/{r}" for r in self._roots)

    def missing(self) -> str:
        """Why no pod cgroup can be found ("" when a kubepods cgroup was), as of the last
        watched() or pods()."""
        return self._missing

    def watched(self) -> tuple[str, ...]:
        self._search()
        roots = self._roots or DEFAULT_ROOTS  # none yet: where a default kubelet makes it
        return tuple(str(self.root / level) for r in roots for level in qos_levels(r))

    def _search(self) -> None:
        """Search for the kubepods cgroups while none is found or one found has gone."""
        if not self._roots or not all(_is_dir(self.root / r) for r in self._roots):
            self._roots, self._missing = find_kubepods(self.root)

    def pods(self) -> dict[str, str]:
        self._search()
        out: dict[str, str] = {}
        known: dict[tuple[str, str], str | None] = {}  # this listing's names only
        for level in (level for r in self._roots for level in qos_levels(r)):
            try:
                names = os.listdir(self.root / level)
            except OSError:  # this QoS level is absent
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


def _is_dir(path: Path) -> bool:
    """A directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
