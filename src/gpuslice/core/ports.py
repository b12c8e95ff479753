"""Ports: what the services need from the outside world, as Protocols."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.resources import AdvertisedDevice
from gpuslice.core.response import ContainerAllocation


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

    def close(self) -> None:
        """Release the backend (NVML shutdown, file handles)."""
        ...


class PluginHandler(Protocol):
    """What one device-plugin gRPC server serves for one resource.

    The kubelet adapter translates protobuf to these calls; the services
    implement them over the core. InvalidRequest becomes INVALID_ARGUMENT.
    """

    @property
    def resource_name(self) -> str: ...

    def devices(self) -> tuple[tuple[AdvertisedDevice, bool], ...]:
        """Every advertised device with its health (True = healthy)."""
        ...

    @property
    def generation(self) -> int:
        """Bumped whenever devices() would return something different."""
        ...

    async def wait_changed(self, seen: int) -> int:
        """Return once generation != seen (at once if it already is)."""
        ...

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...

    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation: ...


class PluginEndpoint(Protocol):
    """One served resource: its gRPC server and its kubelet registration."""

    async def start(self) -> None: ...

    async def register(self) -> None:
        """Register with the kubelet; raises on failure."""
        ...

    async def stop(self) -> None: ...
