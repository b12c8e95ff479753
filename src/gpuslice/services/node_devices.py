"""The node's devices, with one owner: what the node holds, whatever front-end tells the
kubelet about it (core.ports.NodeView says what a front-end gets).

What the node knows (the hardware snapshot and settings in force, every hold on a
device, what each front-end serves, the generation) is its NodeState (`state`). What runs
on it is owned by its session (services.node_session), which exists only while the
backend is open: the backend on its one worker thread, PodResources for the holds, the
NVIDIA Container Toolkit's CDI spec files followed, health from the first commit on.
The CDI specs and the MPS daemons are given to each session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
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
from gpuslice.services.holds import DeviceHolds
from gpuslice.services.mps import MpsDaemons
from gpuslice.services.node_session import HEALTH, NodeSession, cancelled
from gpuslice.services.node_state import NodeState

log = structlog.get_logger("gpuslice.node")

T = TypeVar("T")
MOVED = "moved"  # services.holds: devices in use under another resource
__all__ = ["HEALTH", "MOVED", "NodeDevices"]


async def _nothing() -> None:
    return None


class NodeDevices:
    """Implements core.ports.NodeView and AgentNode; see the module doc."""

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
        self.state = NodeState()
        self._open_backend = open_backend
        self._cdi, self._mps = cdi, mps
        self._pod_resources = pod_resources
        self._metrics = metrics
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuslice-backend")
        self._unavailable: str | None = None
        self._session: NodeSession | None = None
        self._holds: DeviceHolds | None = None  # from the first session, with PodResources

    # --- what the node knows (its NodeState), as a front-end reads it ------------------

    @property
    def generation(self) -> int:
        return self.state.generation

    async def wait_changed(self, seen: int) -> int:
        return await self.state.wait_changed(seen)

    @property
    def snapshot(self) -> HardwareSnapshot:
        return self.state.snapshot

    @property
    def settings(self) -> Settings:
        return self.state.settings

    @property
    def unhealthy(self) -> frozenset[str]:
        return self.state.unhealthy

    @property
    def held(self) -> Mapping[str, frozenset[str]]:
        return self.state.held

    @property
    def resources(self) -> tuple[Resource, ...]:
        return self.state.resources

    def hold(self, devices: frozenset[str], *, by: str) -> list[str]:
        return self.state.hold(devices, by=by)

    def on_unhealthy(self, listener: UnhealthyListener) -> None:
        self.state.on_unhealthy(listener)

    # --- what runs on it ------------------------------------------------------------------

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
        return self._session.health_marks if self._session is not None else frozenset()

    @property
    def cdi_problem(self) -> str | None:
        """Why the NVIDIA Container Toolkit's CDI devices are not named (cdi-* only)."""
        return None if self._cdi is None else self._cdi.toolkit_problem

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
        session = self._session
        if session is None:
            raise BackendError("the GPU backend is not open", transient=True)
        backend = session.backend
        return await self.call(lambda: fn(backend))

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

    async def provide(self, plan: DevicePlan) -> AllocateOptions:
        """Through the session (the agent serves only while its backend is open)."""
        if self._session is None:
            raise BackendError("the GPU backend is not open", transient=True)
        return await self._session.provide(plan)

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
            try:
                async with contextlib.AsyncExitStack() as stack:
                    if self._pod_resources is not None:
                        pods = await stack.enter_async_context(self._pod_resources())
                        self._holds = DeviceHolds(pods, lambda held: self.hold(held, by=MOVED))
                    if self._cdi is not None:
                        following = asyncio.create_task(self._cdi.follow_toolkit())
                        stack.push_async_callback(cancelled, following)
                    self._session = NodeSession(
                        self.state,
                        backend,
                        self.call,
                        cdi=self._cdi,
                        mps=self._mps,
                        holds=self._holds,
                        metrics=self._metrics,
                    )
                    try:
                        yield self._session
                    finally:
                        if self._mps is not None:
                            await self._mps.close()
                        await hand_over()
            finally:
                self._session = None
                await self.call(backend.close)
        finally:
            self._pool.shutdown(wait=True)
