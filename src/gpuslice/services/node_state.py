"""What the node knows: the hardware and settings in force (committed together), every
hold on a device merged into one unhealthy set, what each front-end serves, and a
generation bumped on each change. Read by the front-ends and the services; changed on
the event loop only. What runs on the node is services.node_devices."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.ports import Committed, DevicePlan, UnhealthyListener
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions
from gpuslice.core.settings import Settings
from gpuslice.core.sharing import ResourceSettings

# Before the first commit nothing is served: no GPUs, the default settings.
NO_HARDWARE = HardwareSnapshot(gpus=())
NO_SETTINGS = Settings(ResourceSettings(), AllocateOptions(), source="(none committed yet)")


class NodeState:
    def __init__(self) -> None:
        self._committed = Committed(NO_HARDWARE, NO_SETTINGS)
        self._held: dict[str, frozenset[str]] = {}
        self._unhealthy: frozenset[str] = frozenset()
        self._listeners: list[UnhealthyListener] = []
        self._served: dict[str, DevicePlan] = {}
        self._generation = 0
        self._changed = asyncio.Event()

    @property
    def generation(self) -> int:
        return self._generation

    async def wait_changed(self, seen: int) -> int:
        while self._generation == seen:
            await self._changed.wait()
        return self._generation

    @property
    def snapshot(self) -> HardwareSnapshot:
        return self._committed.snapshot

    @property
    def settings(self) -> Settings:
        return self._committed.settings

    @property
    def unhealthy(self) -> frozenset[str]:
        return self._unhealthy

    @property
    def held(self) -> Mapping[str, frozenset[str]]:
        return MappingProxyType(self._held)

    @property
    def plans(self) -> tuple[DevicePlan, ...]:
        """What each front-end serves, as last provided."""
        return tuple(self._served.values())

    @property
    def resources(self) -> tuple[Resource, ...]:
        """What every front-end serves now, as last provided."""
        return tuple(r for plan in self._served.values() for r in plan.resources)

    def commit(self, snapshot: HardwareSnapshot, settings: Settings) -> Committed:
        self._committed = Committed(snapshot, settings)
        self._bump()
        return self._committed

    def serve(self, plan: DevicePlan) -> None:
        """Record what front-end `plan.by` serves (NodeView.provide)."""
        self._served[plan.by] = plan

    def hold(self, devices: frozenset[str], *, by: str) -> list[str]:
        """Hold `devices` Unhealthy for `by`, replacing only what `by` held; returns the
        served names whose lists changed (for the health monitor's log lines)."""
        self._held[by] = devices
        merged = frozenset().union(*self._held.values())
        if merged == self._unhealthy:
            return []
        self._unhealthy = merged
        self._bump()
        return [name for listener in self._listeners for name in listener(merged)]

    def on_unhealthy(self, listener: UnhealthyListener) -> None:
        self._listeners.append(listener)

    def _bump(self) -> None:
        self._generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
