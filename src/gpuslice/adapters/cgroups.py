"""Which pod a process runs in, from /proc/<pid>/cgroup (the ProcessOwners port).

The kubelet puts each pod in a cgroup named after its UID and each container in one
named after its runtime ID, under either cgroup driver and cgroup version:

  cgroupfs: /kubepods/burstable/pod<uid>/<id>
  systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
            cri-containerd-<id>.scope  (crio-<id>.scope, docker-<id>.scope)

Paths may be relative to the reader's cgroup namespace ("/../.."), so the pod and
container parts are searched for, not anchored. `proc_root` is /proc, or the host's
/proc mounted elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

from gpuslice.adapters.outside_files import read_text
from gpuslice.core.usage import ProcessOwner

CGROUP_MAX_BYTES = 64 << 10  # one line per hierarchy; far below this

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:^|[/-])pod({_UID})(?:\.slice)?$")
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-|cri-o-)?([0-9a-f]{64})(?:\.scope)?$")


def owner_of(cgroup_text: str) -> ProcessOwner | None:
    """The pod (and container) of a /proc/<pid>/cgroup file's text; None: no pod."""
    for line in sorted(cgroup_text.splitlines(), key=lambda ln: not ln.startswith("0::")):
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        for i, part in enumerate(parts):
            pod = _POD.search(part)
            if pod is None:
                continue
            leaf = parts[i + 1] if i + 1 < len(parts) else ""
            container = _CONTAINER.match(leaf)
            uid = pod.group(1).replace("_", "-")
            return ProcessOwner(uid, container.group(1) if container else "")
    return None


class CgroupOwners:
    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self._proc = Path(proc_root)

    def owners(self, pids: Collection[int]) -> dict[int, ProcessOwner]:
        """Pods of the given pids; a pid that ended or is in no pod is left out."""
        out = {}
        for pid in pids:
            try:
                # A cgroup name may hold any byte but "/": decoded losslessly, never fatal.
                path = self._proc / str(pid) / "cgroup"
                text = read_text(path, limit=CGROUP_MAX_BYTES, errors="surrogateescape")
            except OSError:
                continue
            owner = owner_of(text)
            if owner is not None:
                out[pid] = owner
        return out
