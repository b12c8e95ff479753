"""Keeps one served, registered endpoint per advertised resource.

apply() touches only what changed: an unchanged resource keeps its server
and registration, a changed one sends a new list, a vanished one is stopped
(its socket removed), a new one is started and registered. A kubelet restart
(kubelet.sock created again) re-creates the socket and re-registers every
resource not already registered with that kubelet, all at once; a deleted
socket of ours is re-created.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from gpuslice.core.ports import PluginEndpoint
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions
from gpuslice.core.topology import Topology
from gpuslice.services.resource_handler import ResourceHandler

log = structlog.get_logger("gpuslice.plugins")


class ServedEndpoint(PluginEndpoint, Protocol):
    def current(self) -> bool:
        """True while our socket is in place and registered with the kubelet serving now."""
        ...


EndpointFactory = Callable[[ResourceHandler], ServedEndpoint]

RETRY_START_S = 0.5
RETRY_MAX_S = 10.0


@dataclass
class _Served:
    handler: ResourceHandler
    endpoint: ServedEndpoint
    registered: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    retry: asyncio.Task[None] | None = None


class PluginManager:
    def __init__(self, factory: EndpointFactory, *, control_devices: Iterable[str] = ()) -> None:
        self._factory = factory
        self._control = tuple(control_devices)
        self._served: dict[str, _Served] = {}
        self._unhealthy: frozenset[str] = frozenset()
        self.registrations = 0  # successful Register calls, for metrics and tests

    @property
    def handlers(self) -> dict[str, ResourceHandler]:
        return {name: s.handler for name, s in self._served.items()}

    def registered(self) -> dict[str, bool]:
        return {name: s.registered for name, s in self._served.items()}

    async def apply(
        self, resources: Iterable[Resource], opts: AllocateOptions, topology: Topology | None
    ) -> dict[str, str]:
        """Serve exactly `resources`; returns what happened to each name."""
        wanted = {r.name: r for r in resources}
        actions: dict[str, str] = {}
        for name in [n for n in self._served if n not in wanted]:
            await self._drop(name)
            actions[name] = "removed"
        fresh: list[str] = []
        for name, res in wanted.items():
            served = self._served.get(name)
            if served is None:
                handler = ResourceHandler(
                    res,
                    opts,
                    topology=topology,
                    unhealthy=self._unhealthy,
                    control_devices=self._control,
                )
                self._served[name] = _Served(handler, self._factory(handler))
                fresh.append(name)
                actions[name] = "added"
            else:
                changed = served.handler.update(resource=res, opts=opts, topology=topology)
                actions[name] = "updated" if changed else "unchanged"
        await asyncio.gather(*(self._start(name) for name in fresh))
        for name, action in actions.items():
            log.info("resource_applied", resource=name, action=action)
        return actions

    def set_unhealthy(self, unhealthy: frozenset[str]) -> list[str]:
        """Mark GPUs unhealthy; returns the resources whose lists changed."""
        self._unhealthy = unhealthy
        return [n for n, s in self._served.items() if s.handler.update(unhealthy=unhealthy)]

    async def kubelet_restarted(self) -> None:
        """kubelet.sock was created again: new sockets and registrations, all at once,
        for every resource not already registered with this kubelet on its socket."""
        log.info("kubelet_restart_detected", resources=len(self._served))
        await asyncio.gather(
            *(self._restart(name, unless_current=True) for name in list(self._served))
        )

    async def socket_deleted(self, name: str) -> None:
        """Our socket for resource `name` vanished: serve it again and re-register."""
        if name in self._served:
            await self._restart(name)

    async def stop(self) -> None:
        await asyncio.gather(*(self._drop(name) for name in list(self._served)))

    async def _start(self, name: str) -> None:
        served = self._served[name]
        async with served.lock:
            await served.endpoint.start()
            await self._register(name, served)

    async def _restart(self, name: str, *, unless_current: bool = False) -> None:
        served = self._served.get(name)
        if served is None:
            return
        async with served.lock:
            if unless_current and served.registered and served.endpoint.current():
                log.info("registration_current", resource=name)
                return
            served.registered = False
            await served.endpoint.stop()
            await served.endpoint.start()
            await self._register(name, served)

    async def _register(self, name: str, served: _Served) -> None:
        try:
            await served.endpoint.register()
        except Exception as exc:  # the kubelet is absent or refusing: retry with backoff
            log.warning("register_failed", resource=name, error=str(exc))
            if served.retry is None or served.retry.done():
                served.retry = asyncio.create_task(self._retry(name, served))
            return
        served.registered = True
        self.registrations += 1
        if served.retry is not None and served.retry is not asyncio.current_task():
            served.retry.cancel()
        log.info("registered", resource=name, devices=len(served.handler.devices()))

    async def _retry(self, name: str, served: _Served) -> None:
        delay = RETRY_START_S
        while not served.registered and self._served.get(name) is served:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            async with served.lock:
                if not served.registered:
                    await self._register(name, served)

    async def _drop(self, name: str) -> None:
        served = self._served.pop(name, None)
        if served is None:
            return
        if served.retry is not None:
            served.retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await served.retry
        async with served.lock:
            await served.endpoint.stop()
        log.info("resource_stopped", resource=name)
