"""The node agent: hardware + config -> served resources, kept truthful.

Blocking backend calls run on one worker thread; health-event waits on a
dedicated thread; everything else on the asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TypeVar

import structlog

from gpuslice import __version__
from gpuslice.config.settings import Settings, check_not_truncated
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import BackendError, GpusliceError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.mps import plan_serving
from gpuslice.core.ports import DirectoryClaim, GpuBackend, Metrics, PodResources
from gpuslice.core.resources import Resource, layout_warnings
from gpuslice.core.restart import RestartBudget
from gpuslice.core.topology import Topology
from gpuslice.core.waiting import unless_stopped
from gpuslice.services.cdi import CdiSpecs
from gpuslice.services.changes import counts, gpus, resource_changes, served
from gpuslice.services.desired import DesiredSettings
from gpuslice.services.health_monitor import HealthMonitor
from gpuslice.services.holds import DeviceHolds
from gpuslice.services.mps import MpsDaemons
from gpuslice.services.off_loop import read_config
from gpuslice.services.plugin_manager import EndpointFactory, PluginManager

log = structlog.get_logger("gpuslice.agent")

T = TypeVar("T")
KUBELET_SOCKET = "kubelet.sock"
LISTED_S = 5.0  # how long a successor waits for the kubelet's streams before saying it serves

# (directory, names) -> async context yielding (name, "created" | "deleted") events.
DirEvents = AbstractAsyncContextManager[AsyncIterator[tuple[str, str]]]
DirWatch = Callable[[str, Collection[str] | None], DirEvents]
# (stop, told who it waits for) -> the claim, or None when stopped first.
ClaimDir = Callable[[asyncio.Event, Callable[[str], None]], Awaitable[DirectoryClaim | None]]


@dataclass
class AgentDeps:
    open_backend: Callable[[], GpuBackend]  # raises BackendError when NVML cannot start
    # Reads the config file's settings (raises ConfigError); None: someone else puts them
    # into the agent's `desired` holder (the per-node config manager).
    load_settings: Callable[[], Settings] | None
    endpoint_factory: EndpointFactory
    plugin_dir: str
    watch: DirWatch | None = None  # None: no kubelet-restart detection (tests of parts)
    control_devices: tuple[str, ...] = ()
    restart_budget: RestartBudget | None = None  # None: upstream's (5 restarts an hour)
    # Told why a reload (SIGHUP) was refused, e.g. to record an Event on the Node.
    on_rejected: Callable[[str], Awaitable[None]] | None = None
    cdi: CdiSpecs | None = None  # keeps CDI specs in step with what is served
    metrics: Metrics = NO_METRICS  # what /metrics reports; nothing without --status-address
    # The kubelet's PodResources, to hold back devices still in use under another
    # resource (services.holds); None: nothing is held.
    pod_resources: Callable[[], AbstractAsyncContextManager[PodResources]] | None = None
    mps: MpsDaemons | None = None  # control daemons of MPS resources (sharing.mps only)
    # Takes the device-plugin directory from a predecessor, awaited once all else is
    # ready and just before serving, so that a successor started beside the old agent
    # serves the instant the old one lets go; handed over to a successor on the way out.
    claim_dir: ClaimDir | None = None


class Agent:
    def __init__(self, deps: AgentDeps) -> None:
        self._deps = deps
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuslice-backend")
        self.manager = PluginManager(
            deps.endpoint_factory,
            control_devices=deps.control_devices,
            budget=deps.restart_budget,
            metrics=deps.metrics,
        )
        self._backend: GpuBackend | None = None
        self.rejected: str | None = None  # why the last reload was refused, until one succeeds
        self.desired = DesiredSettings()  # the settings to serve; the agent converges to them
        self._generation = 0  # the last generation of `desired` tried
        self._settings: Settings | None = None
        self._snapshot: HardwareSnapshot | None = None
        self._monitor: HealthMonitor | None = None
        self.holds: DeviceHolds | None = None  # set once run() has PodResources
        self.mps = deps.mps
        self.ready = asyncio.Event()  # set once every resource was served the first time
        self.waiting_for: str | None = None  # the predecessor holding the directory, if any

    @property
    def snapshot(self) -> HardwareSnapshot:
        """The hardware as last seen (only after `ready` is set)."""
        assert self._snapshot is not None
        return self._snapshot

    @property
    def settings(self) -> Settings:
        """The settings in force (only after `ready` is set)."""
        assert self._settings is not None
        return self._settings

    @property
    def monitor(self) -> HealthMonitor | None:
        return self._monitor

    @property
    def cdi(self) -> CdiSpecs | None:
        return self._deps.cdi

    @property
    def resources(self) -> tuple[Resource, ...]:
        return tuple(h.resource for h in self.manager.handlers.values())

    async def run(self, stop: asyncio.Event, reload: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set; each set of `reload` re-reads the config. The
        settings served first are those desired when it starts; any put later (while the
        backend opens too) are served after them, in order of arrival, latest wins.

        Raises PluginServerFailed when a resource's server failed more often than
        the restart budget allows (after stopping everything).
        """
        claim: DirectoryClaim | None = None
        if self._deps.load_settings is not None:
            self.desired.put(self._deps.load_settings())
        first = await unless_stopped(self.desired.newer_than(0), stop)
        if first is None:
            self._pool.shutdown(wait=True)
            return
        generation, settings = first.result()
        for warning in settings.warnings:
            log.warning("config_warning", config=settings.shown, detail=warning)
        try:
            self._backend = await self._call(self._deps.open_backend)
        except GpusliceError as exc:
            self._pool.shutdown(wait=True)  # idle: nothing more will run on it
            if settings.fail_on_init_error:
                raise
            log.error("backend_unavailable_waiting", error=str(exc), fail_on_init_error=False)
            await stop.wait()
            return
        try:
            async with contextlib.AsyncExitStack() as stack:
                # Watch before serving: a kubelet that starts meanwhile deletes our
                # sockets and creates kubelet.sock, and both must be seen.
                events: AsyncIterator[tuple[str, str]] | None = None
                if self._deps.watch is not None:
                    watch = self._deps.watch(self._deps.plugin_dir, None)
                    events = await stack.enter_async_context(watch)
                if self._deps.pod_resources is not None:
                    pods = await stack.enter_async_context(self._deps.pod_resources())
                    self.holds = DeviceHolds(pods, self._hold_moved)
                if self._deps.claim_dir is not None:
                    claim = await self._deps.claim_dir(stop, self._waiting)
                    self.waiting_for = None
                    if claim is None:
                        return  # stopped while a predecessor still served
                await self._serve_first(generation, settings)
                self._monitor = HealthMonitor(
                    self._backend,
                    settings.xid_policy,
                    self.manager.set_unhealthy,
                    recovery=settings.recovery,
                    call=self._call,
                    metrics=self._deps.metrics,
                )
                self._monitor.set_hardware(self.snapshot, self.resources)
                await stack.enter_async_context(self._monitor)
                self.ready.set()
                log.info(
                    "agent_started",
                    version=__version__,
                    config=settings.shown,
                    source=settings.source,
                    summary=settings.summary,
                    gpus=gpus(self.snapshot),
                    serving=served(counts(self.resources)),
                )
                if claim is not None:  # a predecessor waits for it to end its streams
                    stack.push_async_callback(
                        _cancelled, asyncio.create_task(self._say_serving(claim))
                    )
                tasks = [asyncio.create_task(self._converge())]
                if events is not None:
                    tasks.append(asyncio.create_task(self._watch_kubelet(events)))
                if reload is not None:
                    tasks.append(asyncio.create_task(self._reload_loop(reload)))
                if self.holds is not None:
                    serving = lambda: (self.snapshot, self.resources)  # noqa: E731
                    tasks.append(asyncio.create_task(self.holds.run(serving)))
                try:
                    await _first_of(tasks, stop, self.manager.failed)
                    crashed = _crashed(tasks)
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                if crashed is not None:
                    raise crashed
                if self.manager.error is not None:
                    raise self.manager.error
        finally:
            if self._deps.mps is not None:  # the daemons run on: a successor adopts them
                await self._deps.mps.close()
            if claim is not None:  # serve on until a successor has registered
                self.manager.release_sockets()
                await claim.hand_over()
                claim = None
            await self.manager.stop()  # every stream ended, every socket removed
            if claim is not None:  # a successor may serve now, while we close the rest
                claim.release()
            backend = self._backend
            await self._call(backend.close)
            self._pool.shutdown(wait=True)
            log.info("agent_stopped")

    async def reload(self) -> bool:
        """Re-read the config file and serve it; a bad one keeps the last good one, and
        so does an empty one replacing a config that had content (a truncated write)."""
        load = self._deps.load_settings
        if load is None:  # per-node configs: the config manager re-reads
            log.warning("reload_ignored_settings_come_from_elsewhere")
            return False
        try:
            settings = await read_config(load)  # off the loop, bounded in time
            if self._settings is not None:
                check_not_truncated(settings, self._settings)
            await self.apply_settings(settings)
        except BackendError as exc:
            log.error("hardware_unreadable_keeping_last_good", error=str(exc))
            return False
        except GpusliceError as exc:
            log.error("config_rejected_keeping_last_good", error=str(exc))
            self.rejected = f"config rejected, keeping the last good one: {exc}"
            # A reload reads the same file (and entry): the rejected config has its name.
            self._deps.metrics.config_rejected(self._settings.shown if self._settings else "")
            if self._deps.on_rejected is not None:
                await self._deps.on_rejected(self.rejected)
            return False
        self.rejected = None
        return True

    async def apply_settings(self, settings: Settings) -> None:
        """Make `settings` the desired ones and wait until they are served, touching only
        what changed (before the agent is ready, until it started). Raises GpusliceError
        (nothing changed) when they cannot be served on this hardware."""
        await self.desired.request(settings)

    async def _serve_first(self, generation: int, settings: Settings) -> None:
        try:
            await self._apply(settings)
        except GpusliceError as exc:
            self.desired.settle(generation, exc)
            raise
        self._generation = generation
        self._deps.metrics.config_applied(settings.shown)
        self.desired.settle(generation, None)

    async def _converge(self) -> None:
        """Serve each newer desired value as it comes; settle each with its outcome."""
        while True:
            generation, settings = await self.desired.newer_than(self._generation)
            self._generation = generation
            try:
                await self._serve(settings)
            except GpusliceError as exc:
                self.desired.settle(generation, exc)
            else:
                self.desired.settle(generation, None)

    async def _serve(self, settings: Settings) -> None:
        for warning in settings.warnings:
            log.warning("config_warning", config=settings.shown, detail=warning)
        before = counts(self.resources)
        await self._apply(settings)
        if self._monitor is not None:
            self._monitor.set_hardware(self.snapshot, self.resources)
        changes = resource_changes(before, counts(self.resources))
        log.info("config_applied", config=settings.shown, changes=changes, source=settings.source)
        self._deps.metrics.config_applied(settings.shown)

    async def _apply(self, settings: Settings) -> None:
        assert self._backend is not None
        snapshot = await self._call(self._backend.snapshot)
        mps, root = self._deps.mps, settings.allocate.mps_root
        pinned = mps.pinned_limit_mib if mps else 0
        resources, daemons = plan_serving(  # raises HardwareError
            snapshot, settings.resources, root, pinned_limit_mib=pinned
        )
        for warning in layout_warnings(snapshot.gpus, settings.resources):
            log.warning("hardware_layout_warning", detail=warning)
        if self.holds is not None:  # before the new lists go out
            await self.holds.check(snapshot, resources)
        self._settings, self._snapshot = settings, snapshot
        topology = Topology.from_snapshot(snapshot)
        allocate = settings.allocate
        if self._deps.cdi is not None:  # before the kubelet can allocate a new device
            allocate = await self._deps.cdi.apply(resources, allocate)
        if mps is not None:  # an MPS resource is served only while its daemon answers
            mps.apply(daemons, self.manager.hold_unhealthy, root)
        await self.manager.apply(resources, allocate, topology)
        if not resources:
            log.warning("no_devices_found_waiting", gpus=len(snapshot.gpus))

    async def _reload_loop(self, reload: asyncio.Event) -> None:
        while True:
            await reload.wait()
            reload.clear()
            await self.reload()

    async def _watch_kubelet(self, events: AsyncIterator[tuple[str, str]]) -> None:
        async for name, kind in events:
            if name == KUBELET_SOCKET and kind == "created":
                await self.manager.kubelet_restarted()
            else:  # deleted, or replaced (a file renamed over it)
                # Its supervisor tells a lost or replaced socket from a file of ours: a
                # restart stops the old server (removing its socket) first.
                for res, handler in self.manager.handlers.items():
                    if handler.resource.socket_name == name:
                        await self.manager.socket_deleted(res)

    async def _say_serving(self, claim: DirectoryClaim) -> None:
        """Once the kubelet reads every list from us (LISTED_S at most), say so to a
        predecessor waiting to end its streams."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.manager.listed(), LISTED_S)
        claim.serving()

    def _waiting(self, holder: str) -> None:
        self.waiting_for = holder

    def _hold_moved(self, held: frozenset[str]) -> None:
        self.manager.hold_unhealthy(held, by="moved")

    async def on_backend(self, fn: Callable[[GpuBackend], T]) -> T:
        """fn(backend) on the backend worker, as the agent's own calls run (after `ready`)."""
        backend = self._backend
        if backend is None:
            raise BackendError("the GPU backend is not open", transient=True)
        return await self._call(lambda: fn(backend))

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)


async def _first_of(tasks: list[asyncio.Task[None]], *events: asyncio.Event) -> None:
    """Return once any of `events` is set or any of `tasks` has ended."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([*waits, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _crashed(tasks: list[asyncio.Task[None]]) -> AgentTaskFailed | None:
    """A background task that ended on its own: the agent can no longer follow the
    kubelet or the config, so it stops and exits non-zero rather than serve stale."""
    for task in tasks:
        if not task.done() or task.cancelled():
            continue
        exc = task.exception()
        name = task.get_coro().__qualname__  # type: ignore[union-attr]
        why = "returned" if exc is None else repr(exc)
        log.error("agent_task_failed", task=name, error=why, exc_info=exc)
        return AgentTaskFailed(f"internal task {name} ended unexpectedly: {why}")
    return None


class AgentTaskFailed(GpusliceError):  # noqa: N818 - reads as what happened
    """A background task of the agent ended with an error (a bug): exit so the pod restarts."""
