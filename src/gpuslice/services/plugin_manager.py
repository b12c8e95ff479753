"""Keeps one served, registered endpoint per advertised resource.

apply() touches only what changed: an unchanged resource keeps its server
and registration, a changed one sends a new list, a vanished one is stopped
(its socket removed), a new one is started and registered. A kubelet restart
(kubelet.sock created again) re-creates the socket and re-registers every
resource not already registered with that kubelet, all at once; a deleted
socket of ours is re-created. Either cancels a Register call still in flight:
the kubelet answering it is gone, or is dialling a socket that no longer exists
and would hold the call until it times out.

A server that cannot start, or that goes down on its own, is started again
after a short backoff, within a budget: more than `max_restarts` failures of one
resource, each within `window_s` of the previous, and the manager gives up
(`failed` is set, `error` says why) so the agent exits and Kubernetes restarts
the pod, as upstream does. An endpoint that is also a WatchedEndpoint reports a
server that went down on its own; any other is supervised only through start().
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import structlog

from gpuslice.core.errors import GpusliceError
from gpuslice.core.ports import PluginEndpoint
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions
from gpuslice.core.topology import Topology
from gpuslice.services.resource_handler import ResourceHandler

log = structlog.get_logger("gpuslice.plugins")


class ServedEndpoint(PluginEndpoint, Protocol):
    def current(self) -> bool:
        """True while our socket is in place and our last Register call, answered or
        still in flight, went to the kubelet serving now."""
        ...


@runtime_checkable
class WatchedEndpoint(Protocol):
    """An endpoint that can tell when its server went down without being stopped."""

    def down(self) -> str | None:
        """Why the server stopped serving on its own since start(), or None."""
        ...

    async def wait_down(self) -> str:
        """Return why, once the server stopped serving on its own (call after start)."""
        ...


EndpointFactory = Callable[[ResourceHandler], ServedEndpoint]

RETRY_START_S = 0.5
RETRY_MAX_S = 10.0


class PluginServerFailed(GpusliceError):  # noqa: N818 - reads as what happened
    """A resource's device-plugin server failed more often than the restart budget allows."""


@dataclass(frozen=True)
class RestartBudget:
    """How often one resource's server may fail before the agent gives up."""

    max_restarts: int = 5
    window_s: float = 3600.0  # a failure this long after the previous one starts a new count
    first_delay_s: float = 0.1  # backoff before the first restart, doubled after each
    max_delay_s: float = 5.0

    def describe(self) -> str:
        return f"at most {self.max_restarts} restarts, each within {self.window_s:g}s of the last"


@dataclass
class _Failures:
    count: int = 0
    last: float | None = None

    def record(self, now: float, budget: RestartBudget) -> int:
        """Count one failure; returns the failures in the current run of them."""
        if self.last is None or now - self.last > budget.window_s:
            self.count = 0
        self.count += 1
        self.last = now
        return self.count


@dataclass
class _Served:
    handler: ResourceHandler
    endpoint: ServedEndpoint
    registered: bool = False
    up: bool = False  # its server started and not seen down since
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    retry: asyncio.Task[None] | None = None  # registration retries
    registering: asyncio.Task[None] | None = None  # a Register call in flight
    revive: asyncio.Task[None] | None = None  # a restart after a failure
    down: asyncio.Future[str] | None = None  # done once the server went down on its own
    watch: asyncio.Task[None] | None = None  # acts on `down`
    failures: _Failures = field(default_factory=_Failures)


def _current(served: _Served) -> bool:
    """Registered, or registering, with the kubelet serving now, on our socket."""
    return (served.registered or served.registering is not None) and served.endpoint.current()


class PluginManager:
    def __init__(
        self,
        factory: EndpointFactory,
        *,
        control_devices: Iterable[str] = (),
        budget: RestartBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = factory
        self._control = tuple(control_devices)
        self._budget = budget or RestartBudget()
        self._clock = clock
        self._served: dict[str, _Served] = {}
        self._unhealthy: frozenset[str] = frozenset()
        self.registrations = 0  # successful Register calls, for metrics and tests
        self.server_failures = 0  # servers that could not start or went down, for metrics
        self.failed = asyncio.Event()  # set once a resource's restart budget is spent
        self.error: PluginServerFailed | None = None

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
        """Serve a new resource and wait for its first Register call to end."""
        served = self._served[name]
        async with served.lock:
            await self._bring_up(name, served)
            registering = served.registering
        if registering is not None:
            await asyncio.wait([registering])  # cancelled only by a restart that re-registers

    async def _restart(self, name: str, *, unless_current: bool = False) -> None:
        served = self._served.get(name)
        if served is None:
            return
        if unless_current and _current(served):
            log.info("registration_current", resource=name)
            return
        if served.registering is not None:
            served.registering.cancel()
        async with served.lock:
            if unless_current and _current(served):
                log.info("registration_current", resource=name)
                return
            if not await self._take_down(name, served):
                await self._bring_up(name, served)
            # else its server had died: the restart waits for its backoff (_revive)

    async def _bring_up(self, name: str, served: _Served) -> None:
        """Start the server (with the lock held) and begin registering it. The
        Register call runs outside the lock: a restart cancels it, never waits on it."""
        try:
            await served.endpoint.start()
        except Exception as exc:  # a server that cannot start is a failure of that server
            self._failed(name, served, str(exc))
            return
        served.up = True
        if isinstance(served.endpoint, WatchedEndpoint):
            served.down = asyncio.ensure_future(served.endpoint.wait_down())
            served.watch = asyncio.create_task(self._watch(name, served, served.down))
        served.registering = asyncio.create_task(self._register(name, served))

    async def _take_down(self, name: str, served: _Served) -> bool:
        """Stop the server (with the lock held), counting it as a failure when it had
        gone down on its own (whichever noticed first: its watch, a deleted socket).
        Returns True when it was such a failure."""
        was_up = served.up
        served.registered = served.up = False
        for task in (served.registering, served.watch, served.down):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        served.registering = served.watch = served.down = None
        endpoint = served.endpoint
        await self._stop_endpoint(name, endpoint)
        reason = endpoint.down() if was_up and isinstance(endpoint, WatchedEndpoint) else None
        if reason is None:
            return False
        self._failed(name, served, reason)
        return True

    async def _stop_endpoint(self, name: str, endpoint: ServedEndpoint) -> None:
        """Stop a server; a failure to stop must not end the restart that follows."""
        try:
            await endpoint.stop()
        except Exception as exc:
            log.error("plugin_stop_failed", resource=name, error=str(exc))

    async def _watch(self, name: str, served: _Served, down: Awaitable[str]) -> None:
        await down
        async with served.lock:
            if served.watch is asyncio.current_task():  # else taken down meanwhile
                await self._take_down(name, served)

    def _failed(self, name: str, served: _Served, reason: str) -> None:
        """Count a failure of the resource's server; restart it later or give up."""
        if self._served.get(name) is not served:
            return  # no longer served: nothing to restart
        budget = self._budget
        self.server_failures += 1
        count = served.failures.record(self._clock(), budget)
        if count > budget.max_restarts:
            self.error = PluginServerFailed(
                f"the device-plugin server for {name} failed {count} times in a row "
                f"({budget.describe()}); last failure: {reason}"
            )
            log.error("plugin_server_gave_up", resource=name, failures=count, error=reason)
            self.failed.set()
            return
        delay = min(budget.first_delay_s * 2 ** (count - 1), budget.max_delay_s)
        log.error(
            "plugin_server_failed", resource=name, failures=count, error=reason, retry_in_s=delay
        )
        revive = served.revive
        if revive is None or revive.done() or revive is asyncio.current_task():
            served.revive = asyncio.create_task(self._revive(name, served, delay))

    async def _revive(self, name: str, served: _Served, delay: float) -> None:
        await asyncio.sleep(delay)
        async with served.lock:
            if served.up or self._served.get(name) is not served:
                return  # started again meanwhile (a kubelet restart, a deleted socket)
            await self._stop_endpoint(name, served.endpoint)  # whatever half of it started
            await self._bring_up(name, served)

    async def _register(self, name: str, served: _Served) -> None:
        """One Register call, run as `served.registering`; cancelled when superseded."""
        try:
            await served.endpoint.register()
        except asyncio.CancelledError:  # a kubelet restart or a deleted socket registers anew
            log.info("register_superseded", resource=name)
            raise
        except Exception as exc:  # the kubelet is absent or refusing: retry with backoff
            log.warning("register_failed", resource=name, error=str(exc))
            if served.retry is None or served.retry.done():
                served.retry = asyncio.create_task(self._retry(name, served))
            return
        finally:
            if served.registering is asyncio.current_task():
                served.registering = None
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
                if not served.up or served.registered or served.registering is not None:
                    continue
                registering = asyncio.create_task(self._register(name, served))
                served.registering = registering
            await asyncio.wait([registering])

    async def _drop(self, name: str) -> None:
        served = self._served.pop(name, None)
        if served is None:
            return
        for task in (served.retry, served.revive):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        async with served.lock:
            await self._take_down(name, served)
        log.info("resource_stopped", resource=name)
