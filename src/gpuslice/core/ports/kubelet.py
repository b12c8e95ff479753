"""Ports: what the kubelet offers and takes (PodResources, device-plugin endpoints, its
directory)."""

from __future__ import annotations

import asyncio
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Sequence,
)
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from gpuslice.core.errors import GpusliceError
from gpuslice.core.resources import AdvertisedDevice
from gpuslice.core.response import ContainerAllocation
from gpuslice.core.usage import CheckpointEntry, ContainerDevices

# (directory, names or None for all) -> an async context yielding (name, "created" |
# "deleted") events (adapters.fswatch.DirWatcher).
DirEvents = AbstractAsyncContextManager[AsyncIterator[tuple[str, str]]]
DirWatch = Callable[[str, Collection[str] | None], DirEvents]


class PodResources(Protocol):
    """The kubelet's view of which container holds which devices."""

    async def list(self) -> tuple[ContainerDevices, ...]:
        """Every container's devices (PodResources List). Raises BackendError."""
        ...

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        """resource -> every device ID the kubelet can allocate. Raises BackendError."""
        ...

    def pod_uids(self) -> tuple[CheckpointEntry, ...]:
        """The pod UIDs of allocations (the kubelet's device checkpoint); () if unreadable."""
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


class SocketTaken(GpusliceError):  # noqa: N818 - reads as what happened
    """Another live device plugin serves the endpoint's socket path: it is left alone."""


class PluginEndpoint(Protocol):
    """One served resource: its gRPC server, its socket and its kubelet registration.

    The server's crash watch is part of the contract: a server that stops serving
    without stop() being called is reported by down() and wait_down(), so whoever
    supervises it can restart it.
    """

    async def start(self) -> None:
        """Bind the socket and serve. Raises SocketTaken when another plugin serves
        that path now, another GpusliceError when it cannot be served."""
        ...

    async def register(self) -> None:
        """Register with the kubelet; raises on failure."""
        ...

    def socket_present(self) -> bool:
        """True while the socket file this server bound is in place."""
        ...

    def current(self) -> bool:
        """True while our socket is in place and our last Register call, answered or
        still in flight, went to the kubelet serving now."""
        ...

    def down(self) -> str | None:
        """Why the server stopped serving on its own since start(), or None."""
        ...

    async def wait_down(self) -> str:
        """Return why, once the server stopped serving on its own (call after start)."""
        ...

    async def end_streams(self, timeout_s: float) -> bool:
        """End our ListAndWatch streams, still serving, and return True once the kubelet
        hung up on us (it dropped the resource; at once when it was not connected), False
        after `timeout_s`."""
        ...

    def release_socket(self) -> None:
        """Remove our socket file but keep serving the connections already made (the
        kubelet's), so that a successor can serve the same path; stop() still ends it."""
        ...

    async def wait_dropped(self) -> None:
        """Return once the kubelet cancelled a ListAndWatch stream that we did not end
        (it dropped the resource; call after start, again for the next one)."""
        ...

    async def stop(self) -> None:
        """Stop serving and remove our socket; never raises for a server already down."""
        ...


class DirectoryClaim(Protocol):
    """The device-plugin directory, held by this agent alone until it hands it over, and
    the kubelet's streams, which only one agent at a time may have (see
    adapters.deviceplugin.handover)."""

    def take_streams(self) -> bool:
        """True when no other agent streams to the kubelet now (the streams are ours)."""
        ...

    async def decoy(self, resources: Collection[str]) -> bool:
        """Leave the kubelet with no current client for `resources` (a Register call it
        refuses, as expected), so that a predecessor's streams end with nothing done;
        True when it did for each."""
        ...

    def serving(self) -> None:
        """Say that every resource is served, ready to register (a predecessor may end
        its streams)."""
        ...

    def registered(self) -> None:
        """Say that every resource is registered (a predecessor may stop serving)."""
        ...

    async def wait_registered(self) -> bool:
        """(Once handed over) return True once the successor says it registered every
        resource; False after a bound."""
        ...

    async def wait_streams(self) -> bool:
        """Return once the streams are ours: a predecessor ended them (and the kubelet
        hung up on it or, with no current client, did nothing), or it is gone (True); or
        after a bound (False)."""
        ...

    async def hand_over(self) -> bool:
        """Release the directory (our sockets already removed) and return once a
        successor that took it serves (or after a bound), or at once when none takes
        it; True when one took it. The streams stay ours until release()."""
        ...

    def release(self) -> None:
        """Let go of the directory and the streams (a successor registers now)."""
        ...


# (stop, told who it waits for) -> the claim, or None when stopped first.
ClaimDir = Callable[[asyncio.Event, Callable[[str], None]], Awaitable[DirectoryClaim | None]]
