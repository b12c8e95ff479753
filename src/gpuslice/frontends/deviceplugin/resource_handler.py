"""The live state of one advertised resource, served to the kubelet."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence

from gpuslice.core.allocation import preferred_allocation, validate_allocate
from gpuslice.core.container_spec import container_allocation
from gpuslice.core.resources import AdvertisedDevice, Resource
from gpuslice.core.response import AllocateOptions, ContainerAllocation
from gpuslice.core.topology import Topology


def _token() -> str:
    return str(uuid.uuid4())


class ResourceHandler:
    """Implements core.ports.PluginHandler over a core Resource.

    update() swaps the resource or the set of unhealthy GPUs; when what the
    kubelet would see changes, the generation moves and ListAndWatch streams wake.
    """

    def __init__(
        self,
        resource: Resource,
        opts: AllocateOptions,
        *,
        topology: Topology | None = None,
        unhealthy: frozenset[str] = frozenset(),
        control_devices: Sequence[str] = (),
        token: Callable[[], str] = _token,
    ) -> None:
        self._resource = resource
        self._opts = opts
        self._topology = topology
        self._unhealthy = unhealthy
        self._control = tuple(control_devices)
        self._token = token
        self._generation = 0
        self._changed = asyncio.Event()
        self._devices = self._listing()

    @property
    def resource(self) -> Resource:
        return self._resource

    @property
    def opts(self) -> AllocateOptions:
        return self._opts

    @property
    def resource_name(self) -> str:
        return self._resource.name

    @property
    def generation(self) -> int:
        return self._generation

    def devices(self) -> tuple[tuple[AdvertisedDevice, bool], ...]:
        return self._devices

    def unhealthy_count(self) -> int:
        return sum(1 for _, ok in self._devices if not ok)

    async def wait_changed(self, seen: int) -> int:
        while self._generation == seen:
            await self._changed.wait()
        return self._generation

    def update(
        self,
        *,
        resource: Resource | None = None,
        opts: AllocateOptions | None = None,
        topology: Topology | None = None,
        unhealthy: frozenset[str] | None = None,
    ) -> bool:
        """Apply new state; True when the device list the kubelet sees changed."""
        self._resource = resource or self._resource
        self._opts = opts or self._opts
        self._topology = topology or self._topology
        self._unhealthy = self._unhealthy if unhealthy is None else unhealthy
        listing = self._listing()
        if listing == self._devices:
            return False
        self._devices = listing
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        return preferred_allocation(
            self._resource,
            available,
            must_include,
            size,
            policy=self._opts.allocation_policy,
            topology=self._topology,
        )

    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        devices = validate_allocate(self._resource, device_ids)
        return container_allocation(
            self._resource, devices, self._opts, token=self._token(), control_devices=self._control
        )

    def _listing(self) -> tuple[tuple[AdvertisedDevice, bool], ...]:
        bad = self._unhealthy  # GPU UUIDs (every device on them) and MIG UUIDs
        return tuple(
            (d, d.gpu_uuid not in bad and d.physical_id not in bad) for d in self._resource.devices
        )
