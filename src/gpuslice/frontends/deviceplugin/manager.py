"""Keeps one served, registered endpoint per advertised resource.

apply() touches only what changed: an unchanged resource keeps its server and
registration, a changed one sends a new list, a vanished one is stopped (its socket
removed), a new one is started and registered. Each resource has a PluginSupervisor (its
module: the node's supervision idiom plus registration) that owns its endpoint's
lifecycle: kubelet restarts, deleted sockets, Register retries, and servers that
fail, restarted within the restart budget (core.restart). When one resource spends
its budget the manager gives up: `failed` is set and `error` says why, so the agent
exits and Kubernetes restarts the pod, as upstream does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable

import structlog

from gpuslice.core.cdi import uses_cdi
from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.errors import GpusliceError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import Metrics, PluginEndpoint
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions
from gpuslice.core.restart import RestartBudget
from gpuslice.core.topology import Topology
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.frontends.deviceplugin.supervisor import PluginSupervisor
from gpuslice.frontends.deviceplugin.supervisor_events import (
    Counters,
    KubeletRestarted,
    MayRegister,
    PluginState,
    SocketDeleted,
    Timing,
)
from gpuslice.services import supervision

log = structlog.get_logger("gpuslice.plugins")

EndpointFactory = Callable[[ResourceHandler], PluginEndpoint]


class PluginServerFailed(GpusliceError):  # noqa: N818 - reads as what happened
    """A resource's device-plugin server failed more often than the restart budget allows."""


class PluginManager:
    def __init__(
        self,
        factory: EndpointFactory,
        *,
        control_devices: Iterable[str] = (),
        budget: RestartBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self._factory = factory
        self._metrics = metrics
        self._control = tuple(control_devices)
        self._budget = budget or RestartBudget()
        self._timing = Timing(clock, sleep)
        self._counters = Counters()
        self._handlers: dict[str, ResourceHandler] = {}
        self._supervisors: dict[str, PluginSupervisor] = {}
        self._unhealthy: frozenset[str] = frozenset()
        self._may_register = asyncio.Event()
        self._may_register.set()
        self.failed = asyncio.Event()  # set once a resource's restart budget is spent
        self.error: PluginServerFailed | None = None

    @property
    def registrations(self) -> int:
        """Successful Register calls, for metrics and tests."""
        return self._counters.registrations

    @property
    def server_failures(self) -> int:
        """Servers that could not start or went down, for metrics and tests."""
        return self._counters.server_failures

    @property
    def handlers(self) -> dict[str, ResourceHandler]:
        return dict(self._handlers)

    def registered(self) -> dict[str, bool]:
        return {n: s.state is PluginState.REGISTERED for n, s in self._supervisors.items()}

    def states(self) -> dict[str, supervision.State]:
        return {n: s.state for n, s in self._supervisors.items()}

    async def apply(
        self, resources: Iterable[Resource], opts: AllocateOptions, topology: Topology | None
    ) -> dict[str, str]:
        """Serve exactly `resources`; returns what happened to each name."""
        wanted = {r.name: r for r in resources}
        actions: dict[str, str] = {}
        for name in [n for n in self._handlers if n not in wanted]:
            await self._drop(name)
            actions[name] = "removed"
        fresh: list[PluginSupervisor] = []
        for name, res in wanted.items():
            handler = self._handlers.get(name)
            if handler is None:
                handler = ResourceHandler(
                    res,
                    opts,
                    topology=topology,
                    unhealthy=self._unhealthy,
                    control_devices=self._control,
                )
                self._handlers[name] = handler
                fresh.append(self._supervise(name, handler))
                actions[name] = "added"
            else:
                changed = handler.update(resource=res, opts=opts, topology=topology)
                actions[name] = "updated" if changed else "unchanged"
        await asyncio.gather(*(s.start() for s in fresh))
        for name, action in actions.items():
            log.info("resource_applied", resource=name, action=action)
        return actions

    def set_unhealthy(self, unhealthy: frozenset[str]) -> list[str]:
        """The node's unhealthy devices (health and every hold, merged by the node state);
        returns the resources whose lists changed."""
        self._unhealthy = unhealthy
        return [n for n, h in self._handlers.items() if h.update(unhealthy=unhealthy)]

    def set_toolkit(self, found: ToolkitDevices) -> None:
        """The NVIDIA Container Toolkit's CDI devices changed: the next Allocate of every
        resource served with a cdi-* strategy names them (or no longer names a spec gone)."""
        for handler in self._handlers.values():
            if uses_cdi(handler.opts):
                handler.update(opts=dataclasses.replace(handler.opts, toolkit_cdi=found))

    async def kubelet_restarted(self) -> None:
        """kubelet.sock was created again: new sockets and registrations, all at once,
        for every resource not already registered with this kubelet on its socket."""
        log.info("kubelet_restart_detected", resources=len(self._supervisors))
        self._metrics.kubelet_restart_seen()
        await asyncio.gather(*(s.send(KubeletRestarted()) for s in self._supervisors.values()))

    async def socket_deleted(self, name: str) -> None:
        """A socket file of resource `name` vanished: serve it again unless ours is in place."""
        supervisor = self._supervisors.get(name)
        if supervisor is not None:
            await supervisor.send(SocketDeleted())

    def hold_registrations(self) -> None:
        """Serve resources started from now on without registering them, until
        release_registrations() (a predecessor still streams to the kubelet)."""
        self._may_register.clear()

    async def release_registrations(self) -> None:
        """Register every resource held back, at once."""
        if not self._may_register.is_set():
            self._may_register.set()
            await asyncio.gather(*(s.send(MayRegister()) for s in self._supervisors.values()))

    @property
    def holding(self) -> bool:
        """Registrations are held (hold_registrations, not yet released)."""
        return not self._may_register.is_set()

    async def wait_registered(self, timeout_s: float) -> bool:
        """Return True once every resource is registered; False after `timeout_s`."""
        reached = (s.reached(PluginState.REGISTERED) for s in self._supervisors.values())
        try:
            await asyncio.wait_for(asyncio.gather(*reached), timeout_s)
        except TimeoutError:
            return False
        return True

    async def end_streams(self, timeout_s: float) -> dict[str, bool]:
        """End every served resource's streams, still serving; return, for each, whether
        the kubelet hung up on it within `timeout_s` (its endpoint is then stopped)."""
        up = [(n, s) for n, s in self._supervisors.items() if s.state.up]
        hung_up = await asyncio.gather(*(s.endpoint.end_streams(timeout_s) for _, s in up))
        return {name: ok for (name, _), ok in zip(up, hung_up, strict=True)}

    def release_sockets(self) -> None:
        """Remove every served socket file, still serving the kubelet's connections, for
        a successor to serve the same paths (adapters.deviceplugin.handover)."""
        for supervisor in self._supervisors.values():
            if supervisor.state.up:
                supervisor.endpoint.release_socket()

    async def stop(self) -> None:
        await asyncio.gather(*(self._drop(name) for name in list(self._handlers)))

    def _supervise(self, name: str, handler: ResourceHandler) -> PluginSupervisor:
        supervisor = PluginSupervisor(
            name,
            self._factory(handler),
            budget=self._budget,
            timing=self._timing,
            counters=self._counters,
            on_failed=self._gave_up,
            metrics=self._metrics,
            may_register=self._may_register,
        )
        self._supervisors[name] = supervisor
        return supervisor

    def _gave_up(self, name: str, failures: int, reason: str) -> None:
        if self.error is None:
            self.error = PluginServerFailed(
                f"the device-plugin server for {name} failed {failures} times in a row "
                f"({self._budget.describe()}); last failure: {reason}"
            )
        self.failed.set()

    async def _drop(self, name: str) -> None:
        self._handlers.pop(name, None)
        supervisor = self._supervisors.pop(name, None)
        if supervisor is None:
            return
        await supervisor.stop()
        log.info("resource_stopped", resource=name)
