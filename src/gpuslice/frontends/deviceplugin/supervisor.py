"""One supervisor per served resource: the node's supervision idiom
(services.supervision) with the kubelet's registration after each start.

    NEW --start--> STARTING --served--> REGISTERING --done--> REGISTERED
                     |   ^                  | failed              |  ^ stream
                     |   |                  v                     |  | dropped:
      cannot start / |   +--- restart --- SERVING (retry due,  <---+  | register
      server down    v                     or registrations held)     kubelet restarted,
                                                                    socket deleted
                 BACKING_OFF --budget spent--> FAILED
    socket served by another plugin: BLOCKED until it goes;  stop: STOPPED

A Register call runs beside the supervisor, as its timers, the server's crash watch and
the watch of streams the kubelet cancels do, and only posts an event tagged with its step
or server incarnation; a restart never waits on it. While registrations are held (a
predecessor in a rolling update still streams to the kubelet) a started server waits in
SERVING for MayRegister.
"""

from __future__ import annotations

import asyncio

import structlog

from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import Metrics, PluginEndpoint, SocketTaken
from gpuslice.core.restart import REGISTER_RETRY, RestartBudget
from gpuslice.frontends.deviceplugin.supervisor_events import (
    Counters,
    KubeletRestarted,
    MayRegister,
    OnFailed,
    PluginState,
    RegisterDone,
    RegisterFailed,
    SocketDeleted,
    StreamDropped,
    TimerDue,
    Timing,
)
from gpuslice.services import supervision

log = structlog.get_logger("gpuslice.plugins")


class PluginSupervisor(supervision.Supervisor):
    """Keeps one resource's endpoint served and registered; see the module doc."""

    _log = log
    _key = "resource"

    def __init__(
        self,
        name: str,
        endpoint: PluginEndpoint,
        *,
        budget: RestartBudget,
        timing: Timing,
        counters: Counters,
        on_failed: OnFailed,
        metrics: Metrics = NO_METRICS,
        may_register: asyncio.Event | None = None,  # None: always
    ) -> None:
        super().__init__(name, endpoint, budget=budget, timing=timing, on_failed=on_failed)
        self.endpoint = endpoint
        self._metrics = metrics
        self._counters = counters
        self._attempts = 0  # Register calls failed in a row
        self._blocked = 0  # looks at a socket another plugin serves, in a row
        self._watch_drops: asyncio.Task[None] | None = None
        self._may_register = may_register

    async def _handle_more(self, event: object) -> None:
        state = self.state
        if isinstance(event, KubeletRestarted):
            if (
                state in (PluginState.REGISTERING, PluginState.REGISTERED)
                and self.endpoint.current()
            ):
                log.info("registration_current", resource=self.name)
            elif state.up or state is PluginState.BLOCKED:
                await self._restart()
            # BACKING_OFF: the restart after the backoff registers with that kubelet
        elif isinstance(event, SocketDeleted):
            if state.up and self.endpoint.socket_present():
                return  # an older socket file of ours: ours is in place
            if state.up or state is PluginState.BLOCKED:
                await self._restart()
        elif isinstance(event, StreamDropped):
            # The kubelet serving now dropped us (an older stream of the resource ended
            # after we registered): register again at once. A kubelet restart, which
            # ends every stream too, is left to KubeletRestarted.
            mine = event.incarnation == self._incarnation and state is PluginState.REGISTERED
            if mine and self.endpoint.current():
                log.warning("stream_dropped_registering_again", resource=self.name)
                await self._register()
        elif isinstance(event, MayRegister) and state is PluginState.SERVING:
            await self._register()
        elif isinstance(event, RegisterDone) and event.step == self._step:
            if state is PluginState.REGISTERING:
                self._attempts = 0
                self._counters.registrations += 1
                self._metrics.registered(self.name)
                self._set(PluginState.REGISTERED)
                log.info("resource_registered", resource=self.name)
        elif isinstance(event, RegisterFailed) and event.step == self._step:
            if state is PluginState.REGISTERING:
                log.warning("register_failed", resource=self.name, error=event.error)
                self._attempts += 1
                self._set(PluginState.SERVING)
                await self._timer(REGISTER_RETRY.delay(self._attempts))
        elif isinstance(event, TimerDue) and state is PluginState.SERVING:
            await self._register()
        elif isinstance(event, TimerDue) and state is PluginState.BLOCKED:
            await self._bring_up()

    def _settles(self, state: supervision.State) -> bool:
        return state not in (PluginState.STARTING, PluginState.REGISTERING)

    async def _start_failed(self, exc: Exception) -> bool:
        if not isinstance(exc, SocketTaken):
            return False  # a server that cannot start is a failure of that server
        self._blocked += 1
        if self._blocked == 1:
            log.error("plugin_socket_in_use", resource=self.name, error=str(exc))
        self._set(PluginState.BLOCKED)
        await self._timer(REGISTER_RETRY.delay(self._blocked))
        return True

    async def _after_start(self) -> None:
        if self._blocked:
            log.info("plugin_socket_free", resource=self.name)
            self._blocked = 0
        self._watch_drops = asyncio.create_task(self._dropped(self._incarnation))
        if self._may_register is None or self._may_register.is_set():
            await self._register()
        else:
            log.info("registration_held", resource=self.name)
            self._set(PluginState.SERVING)

    async def _take_down(self) -> str | None:
        drops, self._watch_drops = self._watch_drops, None
        if drops is not None:
            drops.cancel()
            await asyncio.gather(drops, return_exceptions=True)
        return await super()._take_down()

    async def _dropped(self, incarnation: int) -> None:
        while True:
            await self.endpoint.wait_dropped()
            self._post(StreamDropped(incarnation))

    def _failed(self, reason: str, failures: int, retry_in_s: float | None) -> None:
        self._counters.server_failures += 1
        self._metrics.server_failed(self.name)
        if retry_in_s is None:
            log.error("plugin_server_gave_up", resource=self.name, failures=failures, error=reason)
        else:
            log.error("plugin_server_failed", resource=self.name, failures=failures,
                      error=reason, retry_in_s=retry_in_s)  # fmt: skip

    def _stop_failed(self, exc: Exception) -> None:
        log.error("plugin_stop_failed", resource=self.name, error=str(exc))

    async def _register(self) -> None:
        self._set(PluginState.REGISTERING)
        await self._spawn(self._register_call)

    async def _register_call(self, step: int) -> None:
        try:
            await self.endpoint.register()
        except asyncio.CancelledError:  # a restart or a stop supersedes it
            log.info("register_superseded", resource=self.name)
            raise
        except Exception as exc:  # the kubelet is absent or refusing: retried
            self._post(RegisterFailed(step, str(exc)))
            return
        self._post(RegisterDone(step))
