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
from typing import Protocol, TypeVar

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.dra.devices import DraDevice
from gpuslice.core.dra.partitions import Partition, Partitioned, owned, partition_node
from gpuslice.core.errors import BackendError
from gpuslice.core.mig import (
    NOT_FOUND,
    GpuInstance,
    MigError,
    MigProfileSpec,
    mode_change_resets,
)
from gpuslice.core.ports import GpuBackend, MigControl
from gpuslice.core.resources import Resource

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
        self, snapshot: HardwareSnapshot, device_plugin: Sequence[Resource], keys: Collection[Key]
    ) -> Partitioned:
        """The GPUs to partition and their devices (profile tables read on the worker);
        `keys` are the claims' instances, whose MIG devices are DRA's own."""
        starts = {(g, s) for g, _, s in keys}
        capable = [g.uuid for g in snapshot.gpus if g.mig_capable]

        def ours(backend: GpuBackend) -> set[str]:
            control = _control(backend)
            return {i.uuid for g in capable for i in control.instances(g)
                    if (g, i.placement.start) in starts}  # fmt: skip

        gpus = owned(snapshot, device_plugin, ours=await self._call(ours))

        def tables(backend: GpuBackend) -> dict[str, tuple[MigProfileSpec, ...]]:
            control = _control(backend)
            return {g.uuid: control.profiles(g.uuid) for g in gpus}

        return partition_node(snapshot, gpus, await self._call(tables))

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
            snapshot = backend.snapshot()
            gpu = next(g for g in snapshot.gpus if g.uuid == gpu_uuid)
            mig = next((m for m in gpu.mig_devices if m.uuid == made.uuid), None)
            return made, (gpu.device_path, *(mig.cap_paths if mig else ()))

        made, paths = await self._call(create)
        log.info("dra_mig_created", gpu=gpu_uuid, profile=part.profile, start=start, gi=made.gi,
                 uuid=made.uuid)  # fmt: skip
        return replace(part.device, uuid=made.uuid, index=f"{part.device.index}:{made.gi}",
                       paths=paths)  # fmt: skip

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


def _mode(backend: GpuBackend, gpu_uuid: str, *, enabled: bool) -> None:
    """MIG mode as wanted, changed only where that needs no GPU reset."""
    control = _control(backend)
    if control.mig_mode(gpu_uuid)[0] == enabled:
        return
    gpu = next((g for g in backend.snapshot().gpus if g.uuid == gpu_uuid), None)
    if gpu is None or mode_change_resets(gpu.architecture):
        raise BackendError(f"MIG mode of GPU {gpu_uuid} is not {'on' if enabled else 'off'}")
    control.set_mig_mode(gpu_uuid, enabled)


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
