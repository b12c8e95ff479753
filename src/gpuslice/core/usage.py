"""What accounting reads: per-process GPU samples, process owners, kubelet allocations.

Plain values; the backends, the cgroup reader and the PodResources client produce
them, core.attribution joins them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Why a utilisation is absent (a label value, never a guess).
UTIL_MIG = "mig"  # NVML has no per-process (nor device) utilisation on MIG
UTIL_UNSUPPORTED = "unsupported"  # this GPU or driver does not report it
UTIL_UNREADABLE = "unreadable"  # the call failed in this sample


@dataclass(frozen=True, slots=True)
class ProcessUse:
    """One process on one GPU or MIG device, as NVML reports it."""

    pid: int  # host PID
    memory_bytes: int
    sm_util: float | None = None  # 0..1 since the previous sample; None: not measured


@dataclass(frozen=True, slots=True)
class DeviceProcesses:
    """The processes of one GPU (MIG disabled) or one MIG device."""

    uuid: str  # the GPU's UUID, or the MIG device's
    processes: tuple[ProcessUse, ...] = ()
    util_absent: str = ""  # why sm_util is None for its processes; "" when measured


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One physical GPU in one sample."""

    uuid: str
    devices: tuple[DeviceProcesses, ...] = ()  # the GPU itself, or each MIG device
    memory_used_bytes: int | None = None  # the whole GPU's; None: not read
    utilisation: float | None = None  # the whole GPU's, 0..1
    util_absent: str = ""  # why utilisation is None
    error: str = ""  # what could not be read on this GPU; the rest of the sample stands


@dataclass(frozen=True, slots=True)
class ProcessSample:
    gpus: tuple[GpuSample, ...] = ()

    def pids(self) -> frozenset[int]:
        return frozenset(p.pid for g in self.gpus for d in g.devices for p in d.processes)


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """The pod a process runs in (from its cgroup, or the simulated events)."""

    pod_uid: str
    container_id: str = ""  # the runtime's ID, "" when the cgroup path does not carry it


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """Device IDs of one resource held by one container (PodResources List)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    pod_uid: str = ""  # filled from the kubelet's checkpoint; "" when unknown


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One entry of the kubelet's device checkpoint: the pod UID PodResources lacks."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
