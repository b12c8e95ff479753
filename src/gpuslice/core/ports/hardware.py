"""Ports: the GPUs and the host they are in (the backend, memory limits, MIG control, time
slices, process owners, the host itself)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.isolation import HostFacts, Limit, LimitReading
from gpuslice.core.mig import GpuInstance, MigProfileSpec
from gpuslice.core.usage import ProcessOwner, ProcessSample


class GpuBackend(Protocol):
    """Source of hardware facts and health events. Calls may block; the
    services run them on one worker thread, never on the event loop."""

    def snapshot(self) -> HardwareSnapshot:
        """Enumerate the node's GPUs and MIG devices. Raises BackendError."""
        ...

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        """Block up to timeout_s for the next health event; None on timeout."""
        ...

    def probe(self, gpu_uuid: str) -> bool:
        """True when the GPU answers normally right now."""
        ...

    def processes(self) -> ProcessSample:
        """The processes on each GPU and MIG device now: per-process data only, not the
        inventory. A GPU that cannot be read carries its error; the call never fails
        for one GPU."""
        ...

    def mig_control(self) -> MigControl | None:
        """The backend's MIG control; None where it cannot change MIG layouts."""
        ...

    def memory_limits(self) -> MemoryLimits | None:
        """The driver's per-cgroup memory limits; None where the backend has no such calls."""
        ...

    def process_owners(self) -> ProcessOwners | None:
        """Who owns its processes, when the backend itself knows (the simulated one); None:
        the host says (Host.process_owners)."""
        ...

    def close(self) -> None:
        """Release the backend (NVML shutdown, file handles)."""
        ...


class MigControl(Protocol):
    """A GPU's MIG mode and instances, read and changed as NVML does. Blocking: run on
    the backend's worker. A refusal raises MigError with NVML's error name: an occupied
    or overlapping placement INSUFFICIENT_RESOURCES, a device with processes IN_USE, a
    mode change left waiting for a GPU reset RESET_REQUIRED. Other failures BackendError."""

    def profiles(self, gpu_uuid: str) -> tuple[MigProfileSpec, ...]:
        """The GPU's GPU-instance profiles with their possible placements."""
        ...

    def instances(self, gpu_uuid: str) -> tuple[GpuInstance, ...]:
        """The GPU instances on the GPU now, by placement."""
        ...

    def mig_mode(self, gpu_uuid: str) -> tuple[bool, bool]:
        """(enabled now, enabled once pending changes apply)."""
        ...

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        """Turn MIG on or off: only on an idle GPU without GPU instances. Where the
        architecture needs a GPU reset (Ampere) the driver resets it; a reset it cannot
        make leaves the change pending (RESET_REQUIRED)."""
        ...

    def create(self, gpu_uuid: str, profile: str, start: int) -> GpuInstance:
        """A GPU instance of `profile` ("1g.5gb"; "1c.3g.20gb" for a 1-slice compute
        instance) at the placement that starts at `start`, with its compute instance."""
        ...

    def destroy(self, gpu_uuid: str, gi: int) -> None:
        """Destroy GPU instance `gi` and its compute instances (done when it is gone)."""
        ...


class MemoryLimits(Protocol):
    """The driver's per-cgroup GPU memory limits (r615): the part of a GpuBackend that
    sets, reads and clears them. `cgroup` is the cgroup's full path as the host names it
    (/sys/fs/cgroup/...). Blocking, on the backend worker; BackendError when refused."""

    def limit_problem(self) -> str:
        """Why the driver cannot set limits ("" when it can)."""
        ...

    def set_memory_limit(self, gpu_uuid: str, cgroup: str, limit: Limit) -> None: ...

    def memory_limit(self, gpu_uuid: str, cgroup: str) -> LimitReading: ...

    def clear_memory_limit(self, gpu_uuid: str, cgroup: str) -> None: ...


class PodCgroups(Protocol):
    """The kubelet's pod cgroups on the host (adapters.cgroup_tree). Blocking reads."""

    def where(self) -> str:
        """Which tree the facts describe, in a few words (this machine's, a simulated
        node's). No I/O."""
        ...

    def kubepods(self) -> tuple[str, ...]:
        """The kubelet's kubepods cgroups (host paths) that the last watched() or pods()
        found, wherever its --cgroup-root and cgroup driver put them. No I/O."""
        ...

    def missing(self) -> str:
        """One line: why the last watched() or pods() found no pod cgroup (what was
        searched); "" when they found the kubepods cgroups. No I/O."""
        ...

    def watched(self) -> tuple[str, ...]:
        """The directories pod cgroups appear in (the kubepods cgroups' QoS levels); the
        kubepods cgroups are searched for when none is known."""
        ...

    def pods(self) -> dict[str, str]:
        """Pod UID -> its cgroup's full host path, for every pod cgroup there now."""
        ...

    def facts(self, driver: str) -> HostFacts:
        """The cgroup version and the dmem controller, with the driver's `driver` problem."""
        ...


class TimeSlicer(Protocol):
    """A GPU's compute-policy time slice, as `nvidia-smi compute-policy --set-timeslice`
    sets it (Default, Short, Medium, Long). Blocking: run on the backend's worker."""

    def set_time_slice(self, gpu_uuid: str, interval: str) -> None:
        """Raises BackendError."""
        ...

    def time_slice(self, gpu_uuid: str) -> str | None:
        """The interval last set here; None when unknown."""
        ...


class Host(Protocol):
    """The machine the agent runs on, real or simulated, chosen once (wiring.host): all
    that differs between the two. A new kind of host implements these."""

    def open_backend(self) -> GpuBackend:
        """The GPU backend (BackendError when it cannot start)."""
        ...

    def imex_present(self) -> frozenset[int]:
        """The IMEX channels whose device node exists."""
        ...

    def control_devices(self) -> tuple[str, ...]:
        """The driver's control device nodes present here, given to every container."""
        ...

    def extra_cdi_nodes(self) -> Mapping[str, tuple[str, ...]]:
        """Per optional CDI device kind (gdrcopy, gds, mofed): the device nodes present."""
        ...

    def machine_type(self, path: str) -> str | None:
        """The machine type read from `path`; None: the snapshot's own."""
        ...

    def pod_cgroups(self, root: str) -> PodCgroups:
        """The kubelet's pod cgroups and the cgroup facts, under `root` (--cgroup-root)."""
        ...

    def process_owners(self) -> ProcessOwners | None:
        """Who owns a GPU process and ends one (None: the backend itself, which knows
        its simulated processes' pods and ends them without signalling the host)."""
        ...

    def mps_binary(self) -> list[str]:
        """The MPS control daemon's command line."""
        ...

    def time_slicer(self) -> TimeSlicer:
        """The GPUs' compute-policy time slice."""
        ...


class ProcessOwners(Protocol):
    """Which pod each process runs in: the cgroup reader, or the simulated backend."""

    def owners(self, pids: Collection[int]) -> Mapping[int, ProcessOwner]:
        """The pod of each of `pids` that runs in one; others are left out. Blocking."""
        ...

    def kill(self, pid: int) -> None:
        """End `pid` as SIGKILL does, only if it is the process last seen in its pod.
        Raises NotProvenError, ProcessLookupError (it ended) or OSError. Blocking."""
        ...
