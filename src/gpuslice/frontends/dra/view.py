"""What the DRA front-end reads of the node: the part of the node device state it uses."""

from __future__ import annotations

from typing import Protocol

from gpuslice.config.settings import Settings


class DeviceView(Protocol):
    """The hardware's health as the node state keeps it (health and every hold merged),
    with a generation bumped on every change; read on the loop."""

    @property
    def settings(self) -> Settings: ...

    @property
    def unhealthy(self) -> frozenset[str]: ...

    @property
    def generation(self) -> int: ...

    async def wait_changed(self, seen: int) -> int: ...
