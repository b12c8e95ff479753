"""Which pod a process runs in, from /proc/<pid>/cgroup (the ProcessOwners port), and
the watchdog's kill of a process proven to be still in the container it was sampled in.

The kubelet puts each pod in a cgroup named after its UID and each container in one
named after its runtime ID, under either cgroup driver and cgroup version:

  cgroupfs: /kubepods/burstable/pod<uid>/<id>   (/kubepods/pod<uid>/<id>: guaranteed)
  systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
            cri-containerd-<id>.scope  (crio-<id>.scope, docker-<id>.scope)

A kubelet with a --cgroup-root nests that hierarchy: /kubelet/kubepods/... (cgroupfs), or
under systemd every slice name takes the root's prefix, as kind's kubelet does:
/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/
kubelet-kubepods-burstable-pod<uid_>.slice.

A pod is only matched inside that hierarchy: the pod's cgroup must sit under `kubepods`
(cgroupfs, directly or under a QoS class) or be a `<p>kubepods[-<qos>]-pod<uid_>.slice` in
its parent `<p>kubepods[-<qos>].slice`, with the same prefix <p> (systemd). A user slice
named `x-pod<uid>.slice` is no pod. Paths may be relative to the reader's cgroup namespace
("/../.."): a parent shown as ".." is an ancestor of the agent's own container, made by
the kubelet or root only.
`proc_root` is /proc, or the host's /proc mounted elsewhere.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from collections.abc import Collection
from pathlib import Path

from gpuslice.adapters.outside_files import read_text
from gpuslice.core.usage import ProcessOwner
from gpuslice.core.watchdog import NotProvenError

PROC_FILE_MAX_BYTES = 64 << 10  # /proc/<pid>/{cgroup,stat}: far below this

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_QOS = ("burstable", "besteffort")
_SYSTEMD_POD = re.compile(rf"((?:[^/]+-)?)kubepods(?:-(burstable|besteffort))?-pod({_UID})\.slice")
_CGROUPFS_POD = re.compile(rf"pod({_UID})")
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-|cri-o-)?([0-9a-f]{64})(?:\.scope)?$")
_UP = ".."


def _pod_in(parts: list[str]) -> tuple[int, str] | None:
    """(index, UID) of the pod component when it sits in the kubelet's hierarchy."""
    for i, part in enumerate(parts):
        parent = parts[i - 1] if i else ""
        if m := _SYSTEMD_POD.fullmatch(part):
            prefix, qos, uid = m.groups()
            wanted = f"{prefix}kubepods-{qos}.slice" if qos else f"{prefix}kubepods.slice"
            if parent in (wanted, _UP) or i == 1:
                return i, uid
        elif m := _CGROUPFS_POD.fullmatch(part):
            grandparent = parts[i - 2] if i > 1 else ""
            if parent in ("kubepods", _UP) or (parent in _QOS and grandparent in ("kubepods", _UP)):
                return i, m.group(1)
    return None


def pod_uid_of(parents: list[str], name: str) -> str | None:
    """The pod UID of the cgroup directory `name` under the path components `parents`
    (relative to the cgroup root), when it is a pod's cgroup in the kubelet's hierarchy."""
    parts = ["", *parents, name]
    found = _pod_in(parts)
    if found is None or found[0] != len(parts) - 1:
        return None
    return found[1].replace("_", "-")


def owner_of(cgroup_text: str) -> ProcessOwner | None:
    """The pod (and container) of a /proc/<pid>/cgroup file's text; None: in no pod, or
    its lines name different pods (nothing can be proven then)."""
    found: list[ProcessOwner] = []
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)[-1].split("/")
        pod = _pod_in(parts)
        if pod is None:
            continue
        i, uid = pod
        container = _CONTAINER.match(parts[i + 1]) if i + 1 < len(parts) else None
        found.append(ProcessOwner(uid.replace("_", "-"), container.group(1) if container else ""))
    if len({o.pod_uid for o in found}) != 1:
        return None
    return max(found, key=lambda o: bool(o.container_id))


def start_time(stat_text: str) -> int:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot.
    With the PID it names one process for the life of the host."""
    return int(stat_text.rsplit(")", 1)[1].split()[19])


class CgroupOwners:
    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self._proc = Path(proc_root)
        self._seen: dict[int, tuple[ProcessOwner, int]] = {}  # the last sample's, by PID

    def owners(self, pids: Collection[int]) -> dict[int, ProcessOwner]:
        """Pods of the given pids; a pid that ended or is in no pod is left out. Each
        owner is remembered with its process's start time for `kill`."""
        seen = {}
        for pid in pids:
            read = self._read(pid)
            if read is not None and read[0] is not None:
                seen[pid] = (read[0], read[1])
        self._seen = seen
        return {pid: owner for pid, (owner, _) in seen.items()}

    def _read(self, pid: int) -> tuple[ProcessOwner | None, int] | None:
        """(owner, start time) of one process; None: it ended or changed while read."""
        where = self._proc / str(pid)
        try:  # a cgroup name may hold any byte but "/": decoded losslessly, never fatal
            before = start_time(_read_text(where / "stat"))
            owner = owner_of(_read_text(where / "cgroup"))
            after = start_time(_read_text(where / "stat"))
        except (OSError, ValueError, IndexError):
            return None
        return (owner, before) if before == after else None

    def kill(self, pid: int) -> None:
        """SIGKILL `pid` only if it is the very process the last sample saw (same start
        time) and still in the same pod and container. A pidfd taken first pins the
        process: a PID reused after the check cannot receive the signal. Raises
        NotProvenError, ProcessLookupError (it ended) or OSError."""
        sampled = self._seen.get(pid)
        if sampled is None:
            raise NotProvenError(f"process {pid} was not seen in a pod's cgroup")
        pidfd = _pidfd_open(pid)
        try:
            now = self._read(pid)
            if now is None or now[1] != sampled[1]:  # the PID may name another process now
                raise ProcessLookupError(pid, "the sampled process ended")
            if now[0] != sampled[0]:
                raise NotProvenError(f"process {pid} left the container's cgroup since the sample")
            if pidfd is None:  # kernel before 5.3: the check above is the last word
                os.kill(pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            if pidfd is not None:
                os.close(pidfd)


def _read_text(path: Path) -> str:
    return read_text(path, limit=PROC_FILE_MAX_BYTES, errors="surrogateescape")


def _pidfd_open(pid: int) -> int | None:
    """A pidfd for `pid`; None where the kernel has none. ProcessLookupError: it ended."""
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        if isinstance(exc, ProcessLookupError):
            raise
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return None
        raise
