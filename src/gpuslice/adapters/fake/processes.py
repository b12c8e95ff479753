"""Simulated GPU processes: those of the node file, then the events file's changes.

{"process": {"pid": 4242, "gpu": 0, "memory_mib": 1200, "pod_uid": "...",
"container_id": "...", "mig": 1, "sm_util": 35}} starts a process or changes it
(the same pid again: it grew, moved or left its pod); {"process_exit": 4242} ends it;
{"allocate": {"pid": 4242, "memory_mib": 512}} makes it allocate more.

Per-cgroup memory limits are modelled as the driver applies them: a limit set on a
pod's (or a container's) cgroup for a GPU bounds what the processes of that cgroup
hold there together. Growing past the hard limit is refused (out of memory): the
process keeps what it had, and the refusal is reported.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpuslice.adapters.cgroups import owner_of
from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.isolation import Limit
from gpuslice.core.usage import (
    UTIL_MIG,
    DeviceProcesses,
    GpuSample,
    ProcessOwner,
    ProcessSample,
    ProcessUse,
)

MIB = 1024 * 1024
PROCESS_KEYS = frozenset({"pid", "gpu", "mig", "memory_mib", "sm_util", "pod_uid", "container_id"})


@dataclass(frozen=True, slots=True)
class SimProcess:
    pid: int
    device: str  # the GPU's or MIG device's UUID
    memory_mib: int
    sm_util: int = 0  # percent, as NVML reports it
    owner: ProcessOwner | None = None


@dataclass(frozen=True, slots=True)
class ProcessExit:
    pid: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """A process allocating `memory_mib` more on its device."""

    pid: int
    memory_mib: int


ALLOCATE_KEYS = frozenset({"pid", "memory_mib"})


def parse_allocate(data: object) -> Allocation:
    """The value of an "allocate" line; ValueError says what is wrong."""
    if not isinstance(data, dict):
        raise ValueError('"allocate" must be an object')
    unknown = sorted(set(data) - ALLOCATE_KEYS)
    if unknown:
        raise ValueError(f"allocate: unknown key {unknown[0]!r} (allowed: memory_mib, pid)")
    return Allocation(_count(data, "pid", minimum=1), _count(data, "memory_mib", minimum=1))


def parse_process(data: Mapping[str, object], snapshot: HardwareSnapshot) -> SimProcess:
    """The value of a "process" line; ValueError says what is wrong."""
    unknown = sorted(set(data) - PROCESS_KEYS)
    if unknown:
        allowed = ", ".join(sorted(PROCESS_KEYS))
        raise ValueError(f"process: unknown key {unknown[0]!r} (allowed: {allowed})")
    pid = _count(data, "pid", minimum=1)
    gpu = find_gpu(data.get("gpu"), snapshot, "process: ")
    device = gpu.uuid
    if "mig" in data:
        mig = next((m for m in gpu.mig_devices if m.index == data["mig"]), None)
        if mig is None or isinstance(data["mig"], bool):
            raise ValueError(f"process: GPU {gpu.index} has no MIG device {data['mig']!r}")
        device = mig.uuid
    elif gpu.mig_enabled:
        raise ValueError(f'process: GPU {gpu.index} has MIG enabled: name its "mig" device')
    util = _count(data, "sm_util", minimum=0, default=0)
    if util > 100:
        raise ValueError(f'process: "sm_util" is a percentage, got {util}')
    uid, ctr = data.get("pod_uid", ""), data.get("container_id", "")
    if not isinstance(uid, str) or not isinstance(ctr, str):
        raise ValueError('process: "pod_uid" and "container_id" must be strings')
    owner = ProcessOwner(uid, ctr) if uid else None
    return SimProcess(pid, device, _count(data, "memory_mib", minimum=0), util, owner)


def _count(
    data: Mapping[str, object], key: str, *, minimum: int, default: int | None = None
) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f'process: "{key}" must be an integer >= {minimum}, got {value!r}')
    return value


def find_gpu(ref: object, snapshot: HardwareSnapshot, context: str = "") -> Gpu:
    """The GPU an events-file line names by index or UUID; ValueError (prefixed with
    `context`) when it names none of this node's."""
    if isinstance(ref, int) and not isinstance(ref, bool):
        found = next((g for g in snapshot.gpus if g.index == ref), None)
    elif isinstance(ref, str):
        found = snapshot.gpu_by_uuid(ref)
    else:
        raise ValueError(f'{context}"gpu" must be a GPU index or a GPU UUID')
    if found is None:
        raise ValueError(f"{context}no GPU {ref!r} on this node")
    return found


class ProcessTable:
    """The simulated processes now, by pid."""

    def __init__(self, snapshot: HardwareSnapshot) -> None:
        self._snapshot = snapshot
        self._procs: dict[int, SimProcess] = {
            p.pid: SimProcess(p.pid, g.uuid, p.used_mib) for g in snapshot.gpus for p in g.processes
        }

        self._limits: dict[tuple[str, str], Limit] = {}  # (GPU UUID, cgroup path)
        self._parent = {m.uuid: g.uuid for g in snapshot.gpus for m in g.mig_devices}

    def apply(self, change: SimProcess | ProcessExit | Allocation) -> str | None:
        """Apply one change; a refused allocation returns why (nothing else changes)."""
        if isinstance(change, ProcessExit):
            self._procs.pop(change.pid, None)
            return None
        if isinstance(change, Allocation):
            held = self._procs.get(change.pid)
            if held is None:
                return f"allocate: no simulated process {change.pid}"
            change = SimProcess(
                held.pid, held.device, held.memory_mib + change.memory_mib, held.sm_util, held.owner
            )
        old = self._procs.get(change.pid)
        kept = old.memory_mib if old is not None and old.device == change.device else 0
        refused = self._over_limit(change, change.memory_mib - kept)
        if refused is None:
            self._procs[change.pid] = change
            return None
        if old is None:  # its first allocation failed: it runs, holding nothing there
            self._procs[change.pid] = SimProcess(change.pid, change.device, 0, 0, change.owner)
        return refused

    def relayout(self, snapshot: HardwareSnapshot) -> None:
        """The node's MIG devices changed (the processes on them are kept)."""
        self._snapshot = snapshot
        self._parent = {m.uuid: g.uuid for g in snapshot.gpus for m in g.mig_devices}

    def running_on(self, device: str) -> bool:
        """A process runs on the GPU or MIG device `device`."""
        return any(p.device == device for p in self._procs.values())

    def end(self, pid: int) -> bool:
        """End process `pid`; False when none runs."""
        return self._procs.pop(pid, None) is not None

    def set_limit(self, gpu_uuid: str, cgroup: str, limit: Limit | None) -> None:
        if limit is None:
            self._limits.pop((gpu_uuid, cgroup), None)
        else:
            self._limits[(gpu_uuid, cgroup)] = limit

    def limit(self, gpu_uuid: str, cgroup: str) -> Limit | None:
        return self._limits.get((gpu_uuid, cgroup))

    def used_in(self, gpu_uuid: str, cgroup: str) -> int:
        """Bytes the processes of `cgroup` hold on the GPU (the limit's currentUsed)."""
        return sum(
            p.memory_mib * MIB
            for p in self._procs.values()
            if self._gpu_of(p.device) == gpu_uuid and _inside(p.owner, cgroup)
        )

    def _gpu_of(self, device: str) -> str:
        return self._parent.get(device, device)

    def _over_limit(self, proc: SimProcess, grow_mib: int) -> str | None:
        if grow_mib <= 0 or proc.owner is None:
            return None
        gpu = self._gpu_of(proc.device)
        for (limited, cgroup), limit in sorted(self._limits.items()):
            if limited != gpu or not _inside(proc.owner, cgroup):
                continue
            used = self.used_in(gpu, cgroup)
            if used + grow_mib * MIB > limit.hard:
                return (
                    f"process {proc.pid}: allocating {grow_mib} MiB more is refused (out of "
                    f"memory): its cgroup holds {used // MIB} MiB of a {limit.hard // MIB} MiB "
                    "hard limit"
                )
        return None

    def sample(self) -> ProcessSample:
        by_device: dict[str, list[SimProcess]] = {}
        for proc in self._procs.values():
            by_device.setdefault(proc.device, []).append(proc)
        return ProcessSample(tuple(_gpu_sample(g, by_device) for g in self._snapshot.gpus))

    def owners(self, pids: Collection[int]) -> dict[int, ProcessOwner]:
        out = {}
        for pid in pids:
            proc = self._procs.get(pid)
            if proc is not None and proc.owner is not None:
                out[pid] = proc.owner
        return out


def _inside(owner: ProcessOwner | None, cgroup: str) -> bool:
    """The process runs in `cgroup` (a pod's, or one container's of it)."""
    where = owner_of(cgroup)
    if owner is None or where is None or where.pod_uid != owner.pod_uid:
        return False
    return not where.container_id or where.container_id == owner.container_id


def _gpu_sample(gpu: Gpu, by_device: Mapping[str, list[SimProcess]]) -> GpuSample:
    if gpu.mig_enabled:
        devices = tuple(
            DeviceProcesses(
                m.uuid,
                tuple(ProcessUse(p.pid, p.memory_mib * MIB) for p in by_device.get(m.uuid, [])),
                UTIL_MIG,
            )
            for m in gpu.mig_devices
        )
        used = sum(p.memory_bytes for d in devices for p in d.processes)
        return GpuSample(gpu.uuid, devices, used, None, UTIL_MIG)
    procs = by_device.get(gpu.uuid, [])
    uses = tuple(ProcessUse(p.pid, p.memory_mib * MIB, p.sm_util / 100) for p in procs)
    util = min(1.0, sum(p.sm_util for p in procs) / 100)
    used = sum(u.memory_bytes for u in uses)
    return GpuSample(gpu.uuid, (DeviceProcesses(gpu.uuid, uses),), used, util)
