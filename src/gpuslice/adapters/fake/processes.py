"""Simulated GPU processes: those of the node file, then the events file's changes.

{"process": {"pid": 4242, "gpu": 0, "memory_mib": 1200, "pod_uid": "...",
"container_id": "...", "mig": 1, "sm_util": 35}} starts a process or changes it
(the same pid again: it grew, moved or left its pod); {"process_exit": 4242} ends it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpuslice.core.devices import Gpu, HardwareSnapshot
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

    def apply(self, change: SimProcess | ProcessExit) -> None:
        if isinstance(change, ProcessExit):
            self._procs.pop(change.pid, None)
        else:
            self._procs[change.pid] = change

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
