"""The node's device state, with one owner: what the node holds, whatever front-end
tells the kubelet about it (core.ports.NodeView says what a front-end gets).

It owns the backend and the one worker thread its blocking calls run on, the hardware
snapshot and the settings in force (committed together by the agent), health (the
health monitor and its thread), every other hold on a device (`hold(by=...)`: the
memory-budget watchdog, devices moved while in use, MPS daemons that do not answer),
the CDI specs and the MPS daemons. Each change bumps `generation`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from types import MappingProxyType
from typing import TypeVar

import structlog

from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import BackendError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import (
    DevicePlan,
    GpuBackend,
    Metrics,
    PodResources,
    UnhealthyListener,
)
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions
from gpuslice.core.serving import plan_serving
from gpuslice.core.settings import Settings
from gpuslice.services.cdi import CdiSpecs
from gpuslice.services.health_monitor import HealthMonitor
from gpuslice.services.holds import DeviceHolds
from gpuslice.services.mps import MpsDaemons

log = structlog.get_logger("gpuslice.node")

T = TypeVar("T")
HEALTH = "health"  # the holder name of health's own marks
MOVED = "moved"  # services.holds: devices in use under another resource


async def _nothing() -> None:
    return None


class NodeDevices:
    """Implements core.ports.NodeView; see the module doc."""

    def __init__(
        self,
        open_backend: Callable[[], GpuBackend],  # raises BackendError when NVML cannot start
        *,
        cdi: CdiSpecs | None = None,
        mps: MpsDaemons | None = None,
        # The kubelet's PodResources, to hold back devices still in use under another
        # resource (services.holds); None: nothing is held.
        pod_resources: Callable[[], AbstractAsyncContextManager[PodResources]] | None = None,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self._open_backend = open_backend
        self._cdi = cdi
        self._mps = mps
        self._pod_resources = pod_resources
        self._metrics = metrics
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuslice-backend")
        self._backend: GpuBackend | None = None
        self._unavailable: str | None = None
        self._snapshot: HardwareSnapshot | None = None
        self._settings: Settings | None = None
        self._held: dict[str, frozenset[str]] = {}
        self._unhealthy: frozenset[str] = frozenset()
        self._listeners: list[UnhealthyListener] = []
        self._served: dict[str, DevicePlan] = {}
        self._generation = 0
        self._changed = asyncio.Event()
        self._monitor: HealthMonitor | None = None
        self._holds: DeviceHolds | None = None  # while in session, with PodResources

    # --- what a front-end reads -------------------------------------------------------

    @property
    def generation(self) -> int:
        return self._generation

    async def wait_changed(self, seen: int) -> int:
        while self._generation == seen:
            await self._changed.wait()
        return self._generation

    @property
    def snapshot(self) -> HardwareSnapshot:
        if self._snapshot is None:
            raise NotCommitted("the hardware is read before the first commit")
        return self._snapshot

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            raise NotCommitted("the settings are read before the first commit")
        return self._settings

    @property
    def unavailable(self) -> str | None:
        """Why the backend could not open (the agent waits on without it)."""
        return self._unavailable

    @property
    def mps(self) -> MpsDaemons | None:
        """The MPS daemons' supervisors (readiness reads their waits)."""
        return self._mps

    @property
    def holds(self) -> DeviceHolds | None:
        """What holds back devices moved while in use (in session, with PodResources)."""
        return self._holds

    @property
    def health_marks(self) -> frozenset[str]:
        """What health itself finds unhealthy now (not the other holds)."""
        return self._monitor.unhealthy if self._monitor is not None else frozenset()

    @property
    def committed(self) -> bool:
        return self._snapshot is not None

    @property
    def unhealthy(self) -> frozenset[str]:
        return self._unhealthy

    @property
    def held(self) -> Mapping[str, frozenset[str]]:
        return MappingProxyType(self._held)

    @property
    def resources(self) -> tuple[Resource, ...]:
        """What every front-end serves now, as last provided."""
        return tuple(r for plan in self._served.values() for r in plan.resources)

    def hold(self, devices: frozenset[str], *, by: str) -> None:
        """Hold `devices` Unhealthy for `by`, replacing only what `by` held."""
        self._held[by] = devices
        self._push()

    def on_unhealthy(self, listener: UnhealthyListener) -> None:
        self._listeners.append(listener)

    def on_toolkit(
        self, listener: Callable[[ToolkitDevices], None], *, always: bool = False
    ) -> None:
        """Told the NVIDIA Container Toolkit's CDI devices whenever a change of its spec
        files finds others (while `running`; under a cdi-* strategy, or `always`);
        nothing without CDI specs."""
        if self._cdi is not None:
            self._cdi.on_toolkit(listener, always=always)

    async def call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def on_backend(self, fn: Callable[[GpuBackend], T]) -> T:
        """fn(backend) on the worker thread (accounting's reads). Raises BackendError
        while the backend is not open."""
        backend = self._backend
        if backend is None:
            raise BackendError("the GPU backend is not open", transient=True)
        return await self.call(lambda: fn(backend))

    # --- what the agent drives ----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def session(
        self, hand_over: Callable[[], Awaitable[None]] = _nothing
    ) -> AsyncIterator[NodeSession]:
        """The node's lifecycle, in order. On entry the backend opens on the worker thread
        (GpusliceError out of the `async with`, kept in `unavailable`), then PodResources
        for the holds (checked at each provide) and the toolkit's CDI spec files are
        followed. On the way out: the MPS daemons run on unsupervised (a successor adopts
        them), `hand_over` lets the front-ends stop and hand over, the followers end, and
        the backend and its worker thread close, whatever ended the block."""
        try:
            try:
                backend = await self.call(self._open_backend)
            except Exception as exc:
                self._unavailable = f"the GPU backend is not available: {exc}"
                raise
            self._backend = backend
            async with self._running():
                try:
                    yield NodeSession(self, backend)
                finally:
                    if self._mps is not None:
                        await self._mps.close()
                    await hand_over()
        finally:
            await self._close()

    async def read(self) -> HardwareSnapshot:
        """The hardware now (on the worker thread). Raises BackendError while not open."""
        return await self.on_backend(lambda backend: backend.snapshot())

    def commit(self, snapshot: HardwareSnapshot, settings: Settings) -> None:
        """Make `snapshot` and `settings` the ones in force (checked by every front-end)."""
        self._snapshot, self._settings = snapshot, settings
        self._bump()

    def plan_devices(
        self,
        by: str,
        snapshot: HardwareSnapshot,
        settings: Settings,
        resources: Sequence[Resource],
    ) -> DevicePlan:
        mps, root = self._mps, settings.allocate.mps_root
        pinned = mps.pinned_limit_mib if mps else 0
        # ConfigError and HardwareError: refused like any config
        daemons = plan_serving(snapshot, resources, settings.memory, root, pinned_limit_mib=pinned)
        return DevicePlan(by, tuple(resources), settings.allocate, daemons)

    @property
    def cdi_problem(self) -> str | None:
        """Why the NVIDIA Container Toolkit's CDI devices are not named (cdi-* only)."""
        return None if self._cdi is None else self._cdi.toolkit_problem

    async def provide(self, plan: DevicePlan) -> AllocateOptions:
        self._served[plan.by] = plan
        plans = tuple(self._served.values())
        resources = self.resources
        if self._holds is not None:  # before the new lists go out
            await self._holds.check(self.snapshot, resources)
        allocate = plan.allocate
        if self._cdi is not None:  # before the kubelet can allocate a new device
            allocate = await self._cdi.apply(resources, allocate)  # one settings for all
        if self._mps is not None:  # an MPS resource is served only while its daemon does
            daemons = [d for p in plans for d in p.daemons]
            self._mps.apply(daemons, self.hold, plan.allocate.mps_root)  # returns at once
        if self._monitor is not None:
            self._monitor.set_hardware(self.snapshot, resources)
        return allocate

    async def follow_holds(self) -> None:
        """Check the holds every few seconds against what is served; until cancelled."""
        if self._holds is None:
            await asyncio.Event().wait()
            return
        await self._holds.run(lambda: (self.snapshot, self.resources))

    # --- inside ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if self._pod_resources is not None:
                pods = await stack.enter_async_context(self._pod_resources())
                self._holds = DeviceHolds(pods, lambda held: self.hold(held, by=MOVED))
            if self._cdi is not None:
                following = asyncio.create_task(self._cdi.follow_toolkit())
                stack.push_async_callback(_cancelled, following)
            yield

    @contextlib.asynccontextmanager
    async def watch_health(self, backend: GpuBackend) -> AsyncIterator[None]:
        """Health of `backend`'s GPUs while the block runs (through the session)."""
        settings = self.settings
        self._monitor = HealthMonitor(
            backend,
            settings.xid_policy,
            self.health_changed,
            recovery=settings.recovery,
            call=self.call,
            metrics=self._metrics,
        )
        self._monitor.set_hardware(self.snapshot, self.resources)
        async with self._monitor:
            yield

    async def _close(self) -> None:
        """Close the backend and its worker thread."""
        try:
            backend, self._backend = self._backend, None
            if backend is not None:
                await self.call(backend.close)
        finally:
            self._pool.shutdown(wait=True)

    def health_changed(self, unhealthy: frozenset[str]) -> list[str]:
        """Health's own marks (the health monitor's on_change); returns the served names
        whose lists changed, for its log lines."""
        self._held[HEALTH] = unhealthy
        return self._push()

    def _push(self) -> list[str]:
        merged = frozenset().union(*self._held.values())
        if merged == self._unhealthy:
            return []
        self._unhealthy = merged
        self._bump()
        return [name for listener in self._listeners for name in listener(merged)]

    def _bump(self) -> None:
        self._generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class NodeSession:
    """The node while its backend is open (NodeDevices.session)."""

    def __init__(self, devices: NodeDevices, backend: GpuBackend) -> None:
        self._devices, self._backend = devices, backend

    def watching_health(self) -> AbstractAsyncContextManager[None]:
        """Health (events and re-probes, by the settings in force) while the block runs;
        after the first commit (NotCommitted before)."""
        return self._devices.watch_health(self._backend)


class NotCommitted(RuntimeError):  # noqa: N818 - reads as what happened
    """Read before the first commit of a snapshot and settings (a bug)."""
