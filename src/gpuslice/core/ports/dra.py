"""Ports: The DRA front-end's outside world: kubelet plugin endpoint, checkpoint, CDI specs, API."""

from __future__ import annotations

from collections.abc import (
    AsyncIterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the DRA model loads with the DRA front-end, not with every run
    from gpuslice.core.dra.claims import ClaimRef, PreparedClaim, PrepareResult
    from gpuslice.core.dra.health import DeviceHealth
    from gpuslice.core.dra.slices import SliceChange


class DraHandler(Protocol):
    """What the DRA kubelet plugin serves (frontends.dra.DraDriver); the kubelet adapter
    translates protobuf to these calls. Every claim asked for gets an answer."""

    @property
    def driver(self) -> str: ...

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Claim UID -> its devices or why not (idempotent, by UID)."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> "" when it is unprepared now, else why not (idempotent)."""
        ...

    def health(self) -> tuple[DeviceHealth, ...]:
        """Every published device's health (the complete list)."""
        ...

    @property
    def health_generation(self) -> int: ...

    async def wait_health_changed(self, seen: int) -> int:
        """Return once health_generation != seen."""
        ...


class DraEndpoint(Protocol):
    """The DRA plugin's two sockets: registration (plugins_registry) and service."""

    async def start(self) -> None:
        """Bind both sockets and serve. Raises GpusliceError when they cannot be served."""
        ...

    def sockets_present(self) -> bool:
        """True while both socket files we bound are in place."""
        ...

    def registered(self) -> bool:
        """The kubelet told us (NotifyRegistrationStatus) that it registered the plugin."""
        ...

    @property
    def registration_changes(self) -> int:
        """How many times the kubelet told a registration outcome or a registered
        plugin stopped serving."""
        ...

    async def wait_registration(self, seen: int) -> int:
        """Until registration_changes is no longer `seen`; the new count."""
        ...

    async def stop(self) -> None:
        """Stop serving and remove our sockets."""
        ...


class ClaimCheckpoint(Protocol):
    """The prepared claims on disk, so unprepare works after an agent restart."""

    async def load(self) -> dict[str, PreparedClaim]:
        """Claim UID -> prepared claim; {} when there is none. Raises BadCheckpoint when
        the file is not a checkpoint (torn, corrupt, its checksum wrong), BackendError
        when it cannot be read now."""
        ...

    async def save(self, claims: Mapping[str, PreparedClaim], *, durable: bool = True) -> None:
        """Replace the checkpoint atomically and, when `durable`, so that it survives a
        crash of the node (fsync'ed before and after its rename). Raises BackendError."""
        ...

    async def set_aside(self) -> str:
        """Move the file away (a bad one, kept for a person to look at; the oldest such
        copies beyond a few are removed); where it went. Raises BackendError."""
        ...


class ClaimSpecs(Protocol):
    """Per-claim CDI spec files in the CDI spec directory."""

    async def write(self, name: str, text: str) -> None:
        """Raises BackendError."""
        ...

    async def remove(self, name: str) -> None:
        """Gone afterwards (also when it was never there). Raises BackendError."""
        ...

    async def names(self) -> list[str]:
        """The file names in the directory ([] when it does not exist). Raises
        BackendError."""
        ...


class DraApi(Protocol):
    """The Kubernetes API as the DRA plugin uses it: its node's ResourceSlices and the
    ResourceClaims it prepares."""

    async def get_claim(self, namespace: str, name: str) -> dict[str, object]:
        """The ResourceClaim as JSON. Raises BackendError (NotFound when absent)."""
        ...

    async def claims_on(self, node: str, driver: str) -> list[dict[str, object]]:
        """Every ResourceClaim with a device of `driver` in `node`'s pool allocated, read
        in pages, bounded in size and time. Raises BackendError."""
        ...

    async def node_event(self, node: str, reason: str, message: str) -> None:
        """A Warning Event about the Node; best effort: never raises."""
        ...

    async def list_slices(self, node: str, driver: str) -> list[dict[str, object]]:
        """This node's slices of `driver`. Raises BackendError."""
        ...

    async def put_slice(
        self, body: dict[str, object], current: dict[str, object] | None
    ) -> dict[str, object]:
        """Create `body`, or replace `current` (same name) with it; the stored object.
        Raises BackendError."""
        ...

    async def delete_slice(self, name: str) -> None:
        """Raises BackendError; a slice already gone is fine."""
        ...

    def watch_slices(self, node: str, driver: str) -> AsyncIterator[SliceChange]:
        """One watch of this node's slices of `driver`: those there now as ADDED, then
        every change, until the server ends it. Raises BackendError when it fails."""
        ...
