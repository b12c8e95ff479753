"""The node agent: hardware + config -> served resources, kept truthful.

Blocking backend calls run on one worker thread; health-event waits on a
dedicated thread; everything else on the asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import BackendError, GpusliceError
from gpuslice.core.health import XidPolicy
from gpuslice.core.health_state import RecoveryPolicy
from gpuslice.core.ports import GpuBackend
from gpuslice.core.resources import Resource, build_resources, layout_warnings
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import ResourceSettings
from gpuslice.core.topology import Topology
from gpuslice.services.health_monitor import HealthMonitor
from gpuslice.services.plugin_manager import EndpointFactory, PluginManager, RestartBudget

log = structlog.get_logger("gpuslice.agent")

T = TypeVar("T")
KUBELET_SOCKET = "kubelet.sock"

# (directory, names) -> async context yielding (name, "created" | "deleted") events.
DirEvents = AbstractAsyncContextManager[AsyncIterator[tuple[str, str]]]
DirWatch = Callable[[str, Collection[str] | None], DirEvents]


@dataclass(frozen=True)
class Settings:
    """What the agent needs from the effective config."""

    resources: ResourceSettings
    allocate: AllocateOptions
    fail_on_init_error: bool = True
    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    warnings: tuple[str, ...] = ()


@dataclass
class AgentDeps:
    open_backend: Callable[[], GpuBackend]  # raises BackendError when NVML cannot start
    load_settings: Callable[[], Settings]  # raises ConfigError
    endpoint_factory: EndpointFactory
    plugin_dir: str
    watch: DirWatch | None = None  # None: no kubelet-restart detection (tests of parts)
    control_devices: tuple[str, ...] = ()
    restart_budget: RestartBudget | None = None  # None: upstream's (5 restarts an hour)
    # Told why a reload (SIGHUP) was refused, e.g. to record an Event on the Node.
    on_rejected: Callable[[str], Awaitable[None]] | None = None


class Agent:
    def __init__(self, deps: AgentDeps) -> None:
        self._deps = deps
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuslice-backend")
        self.manager = PluginManager(
            deps.endpoint_factory, control_devices=deps.control_devices, budget=deps.restart_budget
        )
        self._backend: GpuBackend | None = None
        self.rejected: str | None = None  # why the last reload was refused, until one succeeds
        self._settings: Settings | None = None
        self._snapshot: HardwareSnapshot | None = None
        self._monitor: HealthMonitor | None = None
        self.ready = asyncio.Event()  # set once every resource was served the first time

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
    def resources(self) -> tuple[Resource, ...]:
        return tuple(h.resource for h in self.manager.handlers.values())

    async def run(self, stop: asyncio.Event, reload: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set; each set of `reload` re-reads the config.

        Raises PluginServerFailed when a resource's server failed more often than
        the restart budget allows (after stopping everything).
        """
        settings = self._deps.load_settings()
        for warning in settings.warnings:
            log.warning("config_warning", detail=warning)
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
                await self._apply(settings)
                self._monitor = HealthMonitor(
                    self._backend,
                    settings.xid_policy,
                    self.manager.set_unhealthy,
                    recovery=settings.recovery,
                    call=self._call,
                )
                self._monitor.set_hardware(self.snapshot, self.resources)
                await stack.enter_async_context(self._monitor)
                self.ready.set()
                tasks: list[asyncio.Task[None]] = []
                if events is not None:
                    tasks.append(asyncio.create_task(self._watch_kubelet(events)))
                if reload is not None:
                    tasks.append(asyncio.create_task(self._reload_loop(reload)))
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
            await self.manager.stop()
            backend = self._backend
            await self._call(backend.close)
            self._pool.shutdown(wait=True)
            log.info("agent_stopped")

    async def reload(self) -> bool:
        """Re-read the config and apply it; a bad one keeps the last good one."""
        try:
            await self.apply_settings(self._deps.load_settings())
        except BackendError as exc:
            log.error("hardware_unreadable_keeping_last_good", error=str(exc))
            return False
        except GpusliceError as exc:
            log.error("config_rejected_keeping_last_good", error=str(exc))
            self.rejected = f"config rejected, keeping the last good one: {exc}"
            if self._deps.on_rejected is not None:
                await self._deps.on_rejected(self.rejected)
            return False
        self.rejected = None
        return True

    async def apply_settings(self, settings: Settings) -> None:
        """Serve `settings` now, touching only what changed. Raises GpusliceError
        (nothing changed) when they cannot be served on this hardware."""
        for warning in settings.warnings:
            log.warning("config_warning", detail=warning)
        await self._apply(settings)
        if self._monitor is not None:
            self._monitor.set_hardware(self.snapshot, self.resources)

    async def _apply(self, settings: Settings) -> None:
        assert self._backend is not None
        snapshot = await self._call(self._backend.snapshot)
        resources = build_resources(snapshot, settings.resources)  # raises HardwareError
        for warning in layout_warnings(snapshot.gpus, settings.resources.mig_strategy):
            log.warning("hardware_layout_warning", detail=warning)
        self._settings, self._snapshot = settings, snapshot
        topology = Topology.from_snapshot(snapshot)
        await self.manager.apply(resources, settings.allocate, topology)
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
            elif kind == "deleted" and not self._socket_exists(name):
                # A socket we re-created ourselves since (a restart stops the old
                # server first) is no loss: acting on it would restart forever.
                for res, handler in self.manager.handlers.items():
                    if handler.resource.socket_name == name:
                        await self.manager.socket_deleted(res)

    def _socket_exists(self, name: str) -> bool:
        return os.path.lexists(os.path.join(self._deps.plugin_dir, name))

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
