"""Simulated MIG control: each GPU's mode and GPU instances, changed as NVML changes them.

Profiles and placements come from the GPU's model (fake.mig_tables). A create at an
occupied or overlapping placement, or past a profile's instance count, is refused with
INSUFFICIENT_RESOURCES; destroying an instance a process runs on is refused with IN_USE.
A mode change needs a GPU without instances and without processes (IN_USE). Where it
resets the GPU (Ampere), a change refused for processes is left pending until a later
call finds the GPU idle; on Hopper and later nothing is left pending. The events file
injects failures: {"mig_fault": {"gpu": 0, "call": "create", "error":
"INSUFFICIENT_RESOURCES"}} fails the GPU's next such call (RESET_REQUIRED on "set_mode"
leaves the change pending, as a reset that failed does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpuslice.adapters.fake.models import GpuModel, mig_device_size, model_named
from gpuslice.adapters.fake.nodefile import derived_uuid, mig_cap_paths
from gpuslice.adapters.fake.processes import find_gpu
from gpuslice.core.devices import Gpu, HardwareSnapshot, MigDevice, MigEngines
from gpuslice.core.mig import (
    IN_USE,
    INSUFFICIENT_RESOURCES,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_SUPPORTED,
    RESET_REQUIRED,
    GpuInstance,
    MigError,
    MigProfileSpec,
    Placement,
    mode_change_resets,
    split_profile,
)
from gpuslice.core.mig_placement import place

CALLS = ("profiles", "instances", "create", "destroy", "set_mode")
ERRORS = (INSUFFICIENT_RESOURCES, IN_USE, RESET_REQUIRED, NO_PERMISSION, "UNKNOWN")
FAULT_KEYS = frozenset({"gpu", "call", "error"})
_FIRST_GI = {8: 0, 4: 1, 2: 3, 1: 7}  # the driver numbers GPU instances by placement


@dataclass(frozen=True, slots=True)
class MigFault:
    """The next `call` on the GPU fails with NVML error `error`."""

    gpu_uuid: str
    call: str
    error: str


def parse_mig_fault(data: object, snapshot: HardwareSnapshot) -> MigFault:
    """The value of a "mig_fault" line; ValueError says what is wrong."""
    if not isinstance(data, dict) or sorted(data) != sorted(FAULT_KEYS):
        raise ValueError('"mig_fault" takes an object with "gpu", "call" and "error"')
    if data["call"] not in CALLS:
        raise ValueError(f'mig_fault: "call" is one of {", ".join(CALLS)}, got {data["call"]!r}')
    if data["error"] not in ERRORS:
        raise ValueError(f'mig_fault: "error" is one of {", ".join(ERRORS)}')
    return MigFault(
        find_gpu(data["gpu"], snapshot, "mig_fault: ").uuid, data["call"], data["error"]
    )


@dataclass
class _GpuMig:
    gpu: Gpu
    model: GpuModel | None
    pending: bool  # the mode once a reset applies it
    instances: list[GpuInstance] = field(default_factory=list)
    devices: dict[tuple[int, int], MigDevice] = field(default_factory=dict)  # (gi, ci)
    problem: str = ""  # why the node file's instances cannot be simulated
    created: int = 0

    @property
    def table(self) -> tuple[MigProfileSpec, ...]:
        return self.model.mig_table if self.model is not None else ()


class MigState:
    """The simulated GPUs' MIG state; `busy(device UUID)` says whether processes run
    there. Not thread-safe: the backend calls it under its lock."""

    def __init__(self, snapshot: HardwareSnapshot, busy: Callable[[str], bool]) -> None:
        self.snapshot = snapshot
        self._busy = busy
        self._gpus = {g.uuid: _adopt(g) for g in snapshot.gpus}
        self._faults: list[MigFault] = []

    def inject(self, fault: MigFault) -> None:
        self._faults.append(fault)

    def profiles(self, gpu_uuid: str) -> tuple[MigProfileSpec, ...]:
        return self._gpu(gpu_uuid, "profiles").table

    def instances(self, gpu_uuid: str) -> tuple[GpuInstance, ...]:
        state = self._gpu(gpu_uuid, "instances")
        return tuple(sorted(state.instances, key=lambda i: (i.placement, i.ci)))

    def mig_mode(self, gpu_uuid: str) -> tuple[bool, bool]:
        state = self._gpu(gpu_uuid, "")
        return state.gpu.mig_enabled, state.pending

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        state = self._gpu(gpu_uuid, "set_mode", pending=enabled)
        where = f"GPU {state.gpu.index}: MIG mode {'on' if enabled else 'off'}"
        if state.gpu.mig_enabled == enabled and state.pending == enabled:
            return
        if self._in_use(state):
            if mode_change_resets(state.gpu.architecture):
                state.pending = enabled  # taken, waiting for a reset the GPU's use blocks
            raise MigError(IN_USE, f"{where}: processes run on the GPU")
        if state.instances:
            raise MigError(IN_USE, f"{where}: the GPU still has GPU instances")
        state.pending = enabled
        self._relayout(state, enabled)

    def create(self, gpu_uuid: str, profile: str, start: int) -> GpuInstance:
        state = self._gpu(gpu_uuid, "create")
        where = f"GPU {state.gpu.index}: create {profile} at {start}"
        if not state.gpu.mig_enabled:
            raise MigError(NOT_SUPPORTED, f"{where}: MIG is disabled")
        try:
            base, compute, slices = split_profile(profile)
        except ValueError:
            raise MigError(INVALID_ARGUMENT, f"{where}: not a MIG profile") from None
        spec = next((s for s in state.table if s.name == base), None)
        if spec is None or compute > slices:
            raise MigError(INVALID_ARGUMENT, f"{where}: the GPU has no such profile")
        placement = next((p for p in spec.placements if p.start == start), None)
        if placement is None:
            raise MigError(INVALID_ARGUMENT, f"{where}: not a placement of {base}")
        held = next((i for i in state.instances if i.placement.overlaps(placement)), None)
        if held is not None:
            taken = f"GPU instance {held.gi} ({held.profile} at {held.placement})"
            raise MigError(INSUFFICIENT_RESOURCES, f"{where}: {taken} is there")
        same = {i.gi for i in state.instances if split_profile(i.profile)[0] == base}
        if len(same) >= spec.instance_count:
            raise MigError(INSUFFICIENT_RESOURCES, f"{where}: {spec.instance_count} at most")
        gi = _gi_for(placement, {i.gi for i in state.instances})
        state.created += 1
        uuid = derived_uuid("MIG", state.gpu.uuid, gi, 0, state.created)
        instance = GpuInstance(profile, placement, gi, 0, uuid)
        state.instances.append(instance)
        state.devices[(gi, 0)] = _device(state, instance)
        self._relayout(state, True)
        return instance

    def destroy(self, gpu_uuid: str, gi: int) -> None:
        state = self._gpu(gpu_uuid, "destroy")
        mine = [i for i in state.instances if i.gi == gi]
        if any(self._busy(i.uuid) for i in mine):
            raise MigError(
                IN_USE, f"GPU {state.gpu.index}: destroy GPU instance {gi}: processes run there"
            )
        if not mine:
            return
        state.instances = [i for i in state.instances if i.gi != gi]
        for instance in mine:
            state.devices.pop((gi, instance.ci), None)
        self._relayout(state, state.gpu.mig_enabled)

    def _gpu(self, gpu_uuid: str, call: str, *, pending: bool | None = None) -> _GpuMig:
        state = self._gpus.get(gpu_uuid)
        if state is None:
            raise MigError(NOT_SUPPORTED, f"no GPU {gpu_uuid} on this node")
        fault = next((f for f in self._faults if (f.gpu_uuid, f.call) == (gpu_uuid, call)), None)
        if fault is not None:
            self._faults.remove(fault)
            if fault.error == RESET_REQUIRED and pending is not None:
                state.pending = pending  # the driver took the change; the reset failed
            raise MigError(fault.error, f"GPU {state.gpu.index}: {call} (injected)")
        if not state.gpu.mig_capable:
            raise MigError(NOT_SUPPORTED, f"GPU {state.gpu.index}: not MIG capable")
        if state.problem:
            raise MigError(NOT_SUPPORTED, f"GPU {state.gpu.index}: {state.problem}")
        return state

    def _in_use(self, state: _GpuMig) -> bool:
        return self._busy(state.gpu.uuid) or any(self._busy(i.uuid) for i in state.instances)

    def _relayout(self, state: _GpuMig, enabled: bool) -> None:
        """The GPU's snapshot entry made from its state (mode and MIG devices)."""
        devices = [replace(d, index=n) for n, d in enumerate(state.devices.values())]
        state.gpu = replace(state.gpu, mig_enabled=enabled, mig_devices=tuple(devices))
        gpus = tuple(self._gpus[g.uuid].gpu for g in self.snapshot.gpus)
        self.snapshot = replace(self.snapshot, gpus=gpus)


def _adopt(gpu: Gpu) -> _GpuMig:
    """A GPU's state from the node file: its MIG devices placed where their GPU-instance
    ids say (as the driver numbers them), else packed as the planner would."""
    model = model_named(gpu.name)
    state = _GpuMig(gpu, model, gpu.mig_enabled)
    state.devices = {(m.gi, m.ci): m for m in gpu.mig_devices}
    specs = {s.name: s for s in state.table}
    by_gi: dict[int, list[MigDevice]] = {}
    for mig in gpu.mig_devices:
        by_gi.setdefault(mig.gi, []).append(mig)
    placed: dict[int, Placement] = {}
    loose: list[tuple[int, MigProfileSpec]] = []
    for gi, migs in by_gi.items():
        spec = specs.get(split_profile(migs[0].profile)[0])
        if spec is None:
            state.problem = f"its MIG device {migs[0].profile} is not a profile of the model"
            return state
        slot = _slot(spec, gi)
        if slot is None or any(slot.overlaps(p) for p in placed.values()):
            loose.append((gi, spec))
        else:
            placed[gi] = slot
    packed = place([s for _, s in loose], list(placed.values()))
    if packed is None:
        state.problem = "its MIG devices do not fit the model's placements"
        return state
    rest = {g: s for g, s in loose}
    for spec, placement in packed:
        gi = next(g for g, s in rest.items() if s == spec)
        placed[gi] = placement
        del rest[gi]
    state.instances = [
        GpuInstance(m.profile, placed[m.gi], m.gi, m.ci, m.uuid) for m in gpu.mig_devices
    ]
    return state


def _slot(spec: MigProfileSpec, gi: int) -> Placement | None:
    """The placement a GPU-instance id stands for, where it is one of the profile's."""
    for placement in spec.placements:
        if _FIRST_GI.get(placement.size, -1) + placement.start // placement.size == gi:
            return placement
    return None


def _gi_for(placement: Placement, used: set[int]) -> int:
    gi = _FIRST_GI.get(placement.size, 0) + placement.start // placement.size
    if gi not in used:
        return gi
    return min(set(range(len(used) + 1)) - used)


def _device(state: _GpuMig, instance: GpuInstance) -> MigDevice:
    size = mig_device_size(state.model, instance.profile)
    _, compute, slices = split_profile(instance.profile)
    return MigDevice(
        uuid=instance.uuid,
        index=0,
        profile=instance.profile,
        gi=instance.gi,
        ci=instance.ci,
        memory_mib=size.memory_mib if size else 0,
        multiprocessors=size.multiprocessors if size else 0,
        cap_paths=mig_cap_paths(state.gpu.minor, instance.gi, instance.ci),
        gi_slices=slices,
        ci_slices=compute,
        engines=size.engines if size else MigEngines(),
    )
