"""What runs on the node while its backend is open: NodeDevices.session makes one once
the backend opened, and it lives no longer than that block. It reads and commits the
hardware, serves each front-end's plan (the holds, CDI specs and MPS daemons) and, from
the first commit on, runs health and the holds' checks (`serving`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.ports import Committed, DevicePlan, GpuBackend, Metrics
from gpuslice.core.response import AllocateOptions
from gpuslice.core.settings import Settings
from gpuslice.services.cdi import CdiSpecs
from gpuslice.services.health_monitor import BlockingCall, HealthMonitor
from gpuslice.services.holds import DeviceHolds
from gpuslice.services.mps import MpsDaemons
from gpuslice.services.node_state import NodeState

HEALTH = "health"  # the holder name of health's own marks


class NodeSession:
    """Implements core.ports.OpenNode; see the module doc."""

    def __init__(
        self,
        state: NodeState,
        backend: GpuBackend,
        call: BlockingCall,  # on the backend's one worker thread
        *,
        cdi: CdiSpecs | None,
        mps: MpsDaemons | None,
        holds: DeviceHolds | None,
        metrics: Metrics,
    ) -> None:
        self.backend, self.holds = backend, holds
        self._state, self._call = state, call
        self._cdi, self._mps, self._metrics = cdi, mps, metrics
        self._monitor: HealthMonitor | None = None

    @property
    def health_marks(self) -> frozenset[str]:
        """What health itself finds unhealthy now (not the other holds)."""
        return self._monitor.unhealthy if self._monitor is not None else frozenset()

    async def read(self) -> HardwareSnapshot:
        """The hardware now (on the worker thread). Raises BackendError."""
        return await self._call(self.backend.snapshot)

    def commit(self, snapshot: HardwareSnapshot, settings: Settings) -> Committed:
        return self._state.commit(snapshot, settings)

    async def provide(self, plan: DevicePlan) -> AllocateOptions:
        state = self._state
        state.serve(plan)
        resources = state.resources
        if self.holds is not None:  # before the new lists go out
            await self.holds.check(state.snapshot, resources)
        allocate = plan.allocate
        if self._cdi is not None:  # before the kubelet can allocate a new device
            allocate = await self._cdi.apply(resources, allocate)  # one settings for all
        if self._mps is not None:  # an MPS resource is served only while its daemon does
            daemons = [d for p in state.plans for d in p.daemons]
            self._mps.apply(daemons, state.hold, plan.allocate.mps_root)  # returns at once
        if self._monitor is not None:
            self._monitor.set_hardware(state.snapshot, resources)
        return allocate

    @contextlib.asynccontextmanager
    async def serving(self, first: Committed) -> AsyncIterator[tuple[asyncio.Task[None], ...]]:
        state, settings = self._state, first.settings
        self._monitor = HealthMonitor(
            self.backend,
            settings.xid_policy,
            lambda unhealthy: state.hold(unhealthy, by=HEALTH),
            recovery=settings.recovery,
            call=self._call,
            metrics=self._metrics,
        )
        self._monitor.set_hardware(first.snapshot, state.resources)
        async with self._monitor, contextlib.AsyncExitStack() as stack:
            tasks: tuple[asyncio.Task[None], ...] = ()
            if self.holds is not None:  # against what is served at each check
                follow = self.holds.run(lambda: (state.snapshot, state.resources))
                tasks = (asyncio.create_task(follow),)
                stack.push_async_callback(cancelled, tasks[0])
            yield tasks


async def cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
