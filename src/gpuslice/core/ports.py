"""Ports: what the services need from the outside world, as Protocols."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
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


class NodeApi(Protocol):
    """The agent's view of the Kubernetes API: its own Node, its NodeFeature, Events."""

    async def node_labels(self, node: str) -> dict[str, str]:
        """The Node's labels now (a full read). Raises BackendError(transient=True)
        when the API cannot be reached."""
        ...

    def watch_node_labels(self, node: str) -> AsyncIterator[dict[str, str]]:
        """Yield the Node's labels after the first full read, then each time they
        change; resumes (re-reading) after a dropped watch or 410 Gone."""
        ...

    async def publish_node_feature(
        self, node: str, namespace: str, labels: Mapping[str, str]
    ) -> bool:
        """Create or update NodeFeature nvidia-features-for-<node> with `labels`;
        False when the stored object already had exactly these labels."""
        ...

    async def record_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        """A Kubernetes Event on the Node (best effort: never raises)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class LabelSink(Protocol):
    """Where node labels go: an NFD features.d file or a NodeFeature object."""

    async def publish(self, labels: Mapping[str, str]) -> bool:
        """Write `labels`; False when nothing changed and nothing was written."""
        ...

    async def remove(self) -> None: ...
