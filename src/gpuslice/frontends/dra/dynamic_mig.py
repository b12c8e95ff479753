"""The MIG instances of partitionable devices (--dra-dynamic-mig): which GPUs DRA
partitions and what it publishes for them (core.dra.partitions), the GPU and compute
instance created at a claim's placement in prepare and destroyed in unprepare, and the
start-up sweep that destroys every instance on those GPUs no completed claim owns.

Every call runs on the backend's worker thread. Instances are found by placement, never
by an ID remembered from before, so a create cut short or a restart is rolled back the
same way. GPUs the device-plugin path serves are never touched, nor is MIG mode turned
on or off where that needs a GPU reset (Ampere).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, TypeVar

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.dra.devices import DraDevice
from gpuslice.core.dra.partitions import Partition, Partitioned, owned, partition_node
from gpuslice.core.errors import BackendError
from gpuslice.core.mig import NOT_FOUND, GpuInstance, MigError, mode_change_resets
from gpuslice.core.ports import GpuBackend, MigControl
from gpuslice.core.resources import Resource
from gpuslice.core.sharing import ResourceSettings

log = structlog.get_logger("gpuslice.dra")
T = TypeVar("T")


class OnBackend(Protocol):
    """fn(backend) on the backend's worker thread (NodeDevices.on_backend)."""

    def __call__(self, fn: Callable[[GpuBackend], T], /) -> Awaitable[T]: ...


Key = tuple[str, str, int]  # (GPU UUID, profile, placement start)


def _control(backend: GpuBackend) -> MigControl:
    control = backend.mig_control()
    if control is None:
        raise BackendError("the GPU backend cannot create MIG instances")
    return control


class MigInstances:
    def __init__(self, on_backend: OnBackend) -> None:
        self._call = on_backend
        self.now = Partitioned()

    async def plan(
        self,
        snapshot: HardwareSnapshot,
        device_plugin: Sequence[Resource],
        keys: Collection[Key],
        settings: ResourceSettings,
        kept: Collection[str] = (),
    ) -> Partitioned:
        """The GPUs to partition and their devices (profile tables read on the worker),
        offering no profile the node's `settings` would serve under a name `kept` on the
        device-plugin API; `keys` are the claims' instances, whose MIG devices are DRA's."""
        starts = {(g, s) for g, _, s in keys}
        enabled = [g.uuid for g in snapshot.gpus if g.mig_capable and g.mig_enabled]
        found = await self._call(partial(_each, enabled, "instances"))
        ours = {i.uuid for g, got in found.items() for i in got if (g, i.placement.start) in starts}
        gpus = owned(snapshot, device_plugin, ours=ours)
        tables = await self._call(partial(_each, [g.uuid for g in gpus], "profiles"))
        return partition_node(snapshot, gpus, tables, settings, kept)

    async def create(self, part: Partition) -> DraDevice:
        """The partition's instance (MIG turned on first where that needs no reset), as
        the concrete device its claim's CDI spec names. Raises BackendError."""
        gpu_uuid = part.device.gpu_uuid
        if part.placement is None:
            await self._call(lambda b: _mode(b, gpu_uuid, enabled=False))
            return part.device
        start = part.placement.start

        def create(backend: GpuBackend) -> tuple[GpuInstance, tuple[str, ...]]:
            _mode(backend, gpu_uuid, enabled=True)
            made = _control(backend).create(gpu_uuid, part.profile, start)
            return made, _paths(backend, gpu_uuid, made.uuid)

        made, paths = await self._call(create)
        log.info("dra_mig_created", gpu=gpu_uuid, profile=part.profile, start=start, gi=made.gi,
                 uuid=made.uuid)  # fmt: skip
        return _concrete(part, made, paths)

    async def find(self, part: Partition) -> DraDevice | None:
        """The partition's instance as it is now (a claim rebuilt from the API server); None
        when there is none at its placement. Raises BackendError."""
        gpu_uuid = part.device.gpu_uuid
        if part.placement is None:
            return part.device
        start = part.placement.start

        def find(backend: GpuBackend) -> tuple[GpuInstance, tuple[str, ...]] | None:
            there = [i for i in _control(backend).instances(gpu_uuid) if i.placement.start == start]
            return (there[0], _paths(backend, gpu_uuid, there[0].uuid)) if there else None

        found = await self._call(find)
        return None if found is None else _concrete(part, *found)

    async def destroy(self, keys: Iterable[Key]) -> None:
        """Destroy the instances at these placements (done when none is there)."""
        for gpu_uuid, profile, start in keys:
            gone = await self._call(partial(_destroy_at, gpu_uuid=gpu_uuid, start=start))
            if gone:
                log.info("dra_mig_destroyed", gpu=gpu_uuid, profile=profile, start=start)

    async def sweep(self, keep: Collection[Key]) -> None:
        """Destroy every instance on the partitioned GPUs that no key in `keep` names."""
        starts = {(g, s) for g, _, s in keep}
        for gpu_uuid in sorted(self.now.gpus):
            found = await self._call(partial(_instances, gpu_uuid=gpu_uuid))
            for inst in [i for i in found if (gpu_uuid, i.placement.start) not in starts]:
                await self._call(partial(_destroy, gpu_uuid=gpu_uuid, gi=inst.gi))
                log.warning("dra_mig_orphan_destroyed", gpu=gpu_uuid, profile=inst.profile,
                            start=inst.placement.start, gi=inst.gi)  # fmt: skip


def _paths(backend: GpuBackend, gpu_uuid: str, mig_uuid: str) -> tuple[str, ...]:
    """The parent's device node and the MIG device's capability nodes."""
    gpu = next(g for g in backend.snapshot().gpus if g.uuid == gpu_uuid)
    mig = next((m for m in gpu.mig_devices if m.uuid == mig_uuid), None)
    return (gpu.device_path, *(mig.cap_paths if mig else ()))


def _concrete(part: Partition, made: GpuInstance, paths: tuple[str, ...]) -> DraDevice:
    index = f"{part.device.index}:{made.gi}"
    return replace(part.device, uuid=made.uuid, index=index, paths=paths)


def _mode(backend: GpuBackend, gpu_uuid: str, *, enabled: bool) -> None:
    """MIG mode as wanted, changed only where that needs no GPU reset."""
    control = _control(backend)
    if control.mig_mode(gpu_uuid)[0] == enabled:
        return
    gpu = next((g for g in backend.snapshot().gpus if g.uuid == gpu_uuid), None)
    if gpu is None or mode_change_resets(gpu.architecture):
        raise BackendError(f"MIG mode of GPU {gpu_uuid} is not {'on' if enabled else 'off'}")
    control.set_mig_mode(gpu_uuid, enabled)


def _each(gpus: Sequence[str], call: str, backend: GpuBackend) -> dict[str, Any]:
    """`call` ("instances" or "profiles") of each GPU; one that fails is left out (not
    partitioned), said in one line."""
    control = _control(backend)
    out = {}
    for gpu in gpus:
        try:
            out[gpu] = getattr(control, call)(gpu)
        except BackendError as exc:
            log.warning("dra_mig_unreadable", gpu=gpu, call=call, error=str(exc))
    return out


def _instances(backend: GpuBackend, *, gpu_uuid: str) -> tuple[GpuInstance, ...]:
    return _control(backend).instances(gpu_uuid)


def _destroy(backend: GpuBackend, *, gpu_uuid: str, gi: int) -> None:
    _control(backend).destroy(gpu_uuid, gi)


def _destroy_at(backend: GpuBackend, *, gpu_uuid: str, start: int) -> bool:
    control = _control(backend)
    for inst in control.instances(gpu_uuid):
        if inst.placement.start == start:
            try:
                control.destroy(gpu_uuid, inst.gi)
            except MigError as exc:
                if exc.code != NOT_FOUND:
                    raise
            return True
    return False
