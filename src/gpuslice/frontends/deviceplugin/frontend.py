"""The device-plugin front-end (core.ports.FrontEnd): the node's devices as resources
(core.resources.build_resources: MIG strategy, replicas, renames, per-GPU placement),
one served and registered endpoint per resource (manager.PluginManager), NVLink topology
for preferred allocations, and the kubelet's directory followed (kubelet_watch)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import GpusliceError
from gpuslice.core.metrics import NO_METRICS, ResourceState
from gpuslice.core.ports import DirWatch, FrontEndStep, Metrics, NodeState
from gpuslice.core.resources import Resource, build_resources, layout_warnings
from gpuslice.core.restart import RestartBudget
from gpuslice.core.settings import Settings
from gpuslice.core.topology import Topology
from gpuslice.frontends.deviceplugin.kubelet_watch import follow_kubelet
from gpuslice.frontends.deviceplugin.manager import EndpointFactory, PluginManager
from gpuslice.frontends.deviceplugin.supervisor_events import State

log = structlog.get_logger("gpuslice.agent")

NAME = "device-plugin"


class DevicePluginFrontEnd:
    def __init__(
        self,
        node: NodeState,
        endpoint_factory: EndpointFactory,
        plugin_dir: str,
        *,
        watch: DirWatch | None = None,  # None: no kubelet-restart detection (tests of parts)
        control_devices: Iterable[str] = (),
        budget: RestartBudget | None = None,  # None: upstream's (5 restarts an hour)
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self._node = node
        self._plugin_dir = plugin_dir
        self._watch = watch
        self.manager = PluginManager(
            endpoint_factory, control_devices=control_devices, budget=budget, metrics=metrics
        )
        node.on_unhealthy(self.manager.set_unhealthy)
        self._stack = contextlib.AsyncExitStack()
        self._events: AsyncIterator[tuple[str, str]] | None = None

    @property
    def name(self) -> str:
        return NAME

    @property
    def resources(self) -> tuple[Resource, ...]:
        return tuple(h.resource for h in self.manager.handlers.values())

    async def start(self) -> None:
        # Watch before serving: a kubelet that starts meanwhile deletes our sockets
        # and creates kubelet.sock, and both must be seen.
        if self._watch is not None:
            self._events = await self._stack.enter_async_context(
                self._watch(self._plugin_dir, None)
            )

    def prepare(self, snapshot: HardwareSnapshot, settings: Settings) -> FrontEndStep:
        resources = build_resources(snapshot, settings.resources)  # raises HardwareError
        plan = self._node.plan_devices(NAME, snapshot, settings, resources)  # raises too
        for warning in layout_warnings(snapshot.gpus, settings.resources):
            log.warning("hardware_layout_warning", detail=warning)

        async def step() -> None:
            await self._node.provide(plan)
            topology = Topology.from_snapshot(snapshot)
            await self.manager.apply(resources, settings.allocate, topology)
            if not resources:
                log.warning("no_devices_found_waiting", gpus=len(snapshot.gpus))

        return step

    async def run(self) -> None:
        if self._events is None:
            await asyncio.Event().wait()  # nothing to follow: until cancelled
        else:
            await follow_kubelet(self._events, self.manager)

    def ready(self) -> bool:
        return all(self.manager.registered().values())

    def status(self) -> Mapping[str, object]:
        return {"resources": self.manager.registered()}

    def resource_states(self) -> tuple[ResourceState, ...]:
        """What each resource advertises and whether it is registered (for /metrics)."""
        registered = self.manager.registered()
        return tuple(
            ResourceState(
                name,
                advertised=len(handler.devices()),
                healthy=sum(1 for _, ok in handler.devices() if ok),
                registered=registered.get(name, False),
            )
            for name, handler in sorted(self.manager.handlers.items())
        )

    def states(self) -> dict[str, State]:
        return self.manager.states()

    @property
    def failed(self) -> asyncio.Event:
        return self.manager.failed

    @property
    def error(self) -> GpusliceError | None:
        return self.manager.error

    async def stop(self) -> None:
        try:
            await self.manager.stop()
        finally:
            await self._stack.aclose()
