"""The device-plugin front-end (core.ports.FrontEnd): the node's devices as resources
(core.resources.build_resources: MIG strategy, replicas, renames, per-GPU placement),
one served and registered endpoint per resource (manager.PluginManager), NVLink topology
for preferred allocations, and the kubelet's directory followed (kubelet_watch).

In a rolling update the device-plugin directory passes from agent to agent
(adapters.deviceplugin.handover): `start` takes it once a predecessor lets go (ready to
take over meanwhile), `run` leaves the kubelet no current client (a decoy), says every
resource is served and registers them once the predecessor's streams are gone, and
`stop` keeps the kubelet's streams open until a successor serves (MPS daemons run on,
and the successor adopts them), then ends them, lets the successor register after a
short settle, and serves Allocate until its registrations returned."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection, Iterable, Mapping

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import GpusliceError
from gpuslice.core.front_ends import split_front_ends
from gpuslice.core.metrics import NO_METRICS, ResourceState
from gpuslice.core.ports import (
    ClaimDir,
    DirectoryClaim,
    DirWatch,
    FrontEndStep,
    Metrics,
    NodeView,
)
from gpuslice.core.resources import Resource, build_resources, layout_warnings
from gpuslice.core.restart import RestartBudget
from gpuslice.core.settings import Settings
from gpuslice.core.topology import Topology
from gpuslice.frontends.deviceplugin.kubelet_watch import follow_kubelet
from gpuslice.frontends.deviceplugin.manager import EndpointFactory, PluginManager
from gpuslice.services.supervision import State

log = structlog.get_logger("gpuslice.agent")

NAME = "device-plugin"
# How long the old agent waits for the kubelet to hang up on its ended streams: the
# kubelet's goroutine runs at once, and does nothing when a decoy left no current client.
SETTLE_S = 0.15
REGISTER_S = 10.0  # the longest a successor waits for its registrations to return


class DevicePluginFrontEnd:
    def __init__(
        self,
        node: NodeView,
        endpoint_factory: EndpointFactory,
        plugin_dir: str,
        *,
        watch: DirWatch | None = None,  # None: no kubelet-restart detection (tests of parts)
        control_devices: Iterable[str] = (),
        budget: RestartBudget | None = None,  # None: upstream's (5 restarts an hour)
        claim_dir: ClaimDir | None = None,  # None: the directory is not claimed here
        metrics: Metrics = NO_METRICS,
        # With DRA on: the only resources served here (the others are DRA's); None: all.
        kept: Collection[str] | None = None,
    ) -> None:
        self._node = node
        self._kept = None if kept is None else frozenset(kept)
        self._plugin_dir = plugin_dir
        self._watch = watch
        self._claim_dir = claim_dir
        self._claim: DirectoryClaim | None = None
        self.waiting_for: str | None = None  # the predecessor holding the directory, if any
        self.manager = PluginManager(
            endpoint_factory, control_devices=control_devices, budget=budget, metrics=metrics
        )
        node.on_unhealthy(self.manager.set_unhealthy)
        node.on_toolkit(self.manager.set_toolkit)
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
        if self._claim_dir is not None:  # last: the instant a predecessor lets go, serve
            self._claim = await self._claim_dir(asyncio.Event(), self._waiting)
            self.waiting_for = None
            if self._claim is not None and not self._claim.take_streams():
                self.manager.hold_registrations()  # until the predecessor's streams end

    def prepare(self, snapshot: HardwareSnapshot, settings: Settings) -> FrontEndStep:
        built = build_resources(snapshot, settings.resources)  # raises HardwareError
        resources = split_front_ends(built, self._kept)[0]
        plan = self._node.plan_devices(NAME, snapshot, settings, resources)  # raises too
        for warning in layout_warnings(snapshot.gpus, settings.resources):
            log.warning("hardware_layout_warning", detail=warning)

        async def step() -> None:
            allocate = await self._node.provide(plan)
            topology = Topology.from_snapshot(snapshot)
            await self.manager.apply(resources, allocate, topology)
            if not resources:
                log.warning("no_devices_found_waiting", gpus=len(snapshot.gpus))

        return step

    async def run(self) -> None:
        serving = None if self._claim is None else asyncio.create_task(self._take_over())
        try:
            if self._events is None:
                await asyncio.Event().wait()  # nothing to follow: until cancelled
            else:
                await follow_kubelet(self._events, self.manager)
        finally:
            if serving is not None:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)

    def ready(self) -> bool:
        return self.waiting_for is not None or all(self.manager.registered().values())

    def status(self) -> Mapping[str, object]:
        status: dict[str, object] = {"resources": self.manager.registered()}
        if self.waiting_for is not None:  # a successor in a rolling update
            status["waiting"] = (
                f"for the agent serving the device-plugin directory now ({self.waiting_for}) "
                "to stop; this one serves the instant it does"
            )
        return status

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
        claim, self._claim = self._claim, None
        try:
            if claim is not None:  # serve on until a successor serves
                self.manager.release_sockets()
                if await claim.hand_over():
                    await self._end_streams(claim)
                claim.release()
            await self.manager.stop()  # every stream ended, every socket removed
        finally:
            if claim is not None:  # released already, unless stopping failed
                claim.release()
            await self._stack.aclose()

    async def _end_streams(self, claim: DirectoryClaim) -> None:
        """End our streams for a successor that serves, then let it register; with no
        hang-up (its decoy took: the kubelet kept our endpoint), serve Allocate until
        its registrations returned."""
        hung_up = await self.manager.end_streams(SETTLE_S)
        settled = sorted(name for name, done in hung_up.items() if not done)
        log.info(
            "streams_handed_over",
            hung_up=sorted(name for name, done in hung_up.items() if done),
            settled=settled,
            settle_s=SETTLE_S,
        )
        claim.release()  # the successor registers now
        if settled:
            await claim.wait_registered()

    def release(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:  # a successor may serve now
            claim.release()

    async def _take_over(self) -> None:
        """Every resource is served (prepared before `run`): with a predecessor streaming,
        leave the kubelet no current client (the decoy) and say so to the predecessor,
        register once its streams are gone, and say when that returned."""
        claim = self._claim
        if claim is None:
            return
        held = self.manager.holding  # a predecessor streams: hand over
        if held:
            await claim.decoy(list(self.manager.handlers))
        claim.serving()
        await claim.wait_streams()
        await self.manager.release_registrations()
        if held and await self.manager.wait_registered(REGISTER_S):
            claim.registered()

    def _waiting(self, holder: str) -> None:
        self.waiting_for = holder
