"""One supervisor per served resource: an explicit state machine fed by events.

    NEW --start--> STARTING --served--> REGISTERING --done--> REGISTERED
                     |   ^                  | failed              |  ^ stream
                     |   |                  v                     |  | dropped:
      cannot start / |   +--- restart --- SERVING (retry due) <---+  | register
      server down    v                                              kubelet restarted,
                                                                    socket deleted
                 BACKING_OFF --budget spent--> FAILED
    socket served by another plugin: BLOCKED until it goes;  stop: STOPPED

Events are handled one at a time by the supervisor's own task, so transitions
never interleave. What waits on the outside (a Register call, a backoff, the
server's crash watch) runs in a task of its own that only posts an event
carrying the step or server incarnation it belongs to; an event from work since
superseded is dropped. The restart budget and backoffs are core.restart's rules.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import Metrics, PluginEndpoint, SocketTaken
from gpuslice.core.restart import REGISTER_RETRY, FailureRun, RestartBudget, after_failure
from gpuslice.services.supervisor_events import (
    UP,
    Counters,
    Event,
    KubeletRestarted,
    OnFailed,
    RegisterDone,
    RegisterFailed,
    ServerDown,
    SocketDeleted,
    Start,
    State,
    Stop,
    StreamDropped,
    TimerDue,
    Timing,
)

log = structlog.get_logger("gpuslice.plugins")


class Supervisor:
    """Keeps one resource's endpoint served and registered; see the module doc."""

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
    ) -> None:
        self.name = name
        self._metrics = metrics
        self.endpoint = endpoint
        self.state = State.NEW
        self._budget, self._timing = budget, timing
        self._counters, self._on_failed = counters, on_failed
        self._failures = FailureRun()
        self._attempts = 0  # Register calls failed in a row
        self._blocked = 0  # looks at a socket another plugin serves, in a row
        self._step = 0  # the current step: a Register call or a timer
        self._step_task: asyncio.Task[None] | None = None
        self._incarnation = 0  # the server started last
        self._watch: asyncio.Task[None] | None = None
        self._watch_drops: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()  # the first Register call ended, or none will run
        self._changed = asyncio.Event()  # set, and replaced, on each change of state
        self._queue: asyncio.Queue[tuple[Event, asyncio.Future[None] | None]] = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def start(self) -> None:
        """Serve, and return once the first Register call ended (or none can run)."""
        await self.send(Start())
        await self._settled.wait()

    async def stop(self) -> None:
        await self.send(Stop())
        await self._task

    async def reached(self, *states: State) -> State:
        """Return the state once it is one of `states`."""
        while self.state not in states:
            await self._changed.wait()
        return self.state

    async def send(self, event: Event) -> None:
        """Hand `event` to the supervisor and return once it was handled."""
        if self._task.done():
            return
        done = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, done))
        await done

    def _post(self, event: Event) -> None:
        self._queue.put_nowait((event, None))

    async def _run(self) -> None:
        while self.state is not State.STOPPED:
            event, done = await self._queue.get()
            try:
                await self._handle(event)
            except Exception as exc:
                if done is None or done.done():
                    log.error("supervisor_event_failed", resource=self.name, error=repr(exc))
                else:
                    done.set_exception(exc)
                continue
            if done is not None and not done.done():
                done.set_result(None)
        while not self._queue.empty():  # sent after the stop: nothing left to do
            _, done = self._queue.get_nowait()
            if done is not None and not done.done():
                done.set_result(None)

    async def _handle(self, event: Event) -> None:
        state = self.state
        if isinstance(event, Stop):
            await self._take_down()
            self._set(State.STOPPED)
        elif state in (State.STOPPED, State.FAILED):
            return
        elif isinstance(event, Start):
            if state is State.NEW:
                await self._bring_up()
        elif isinstance(event, KubeletRestarted):
            if state in (State.REGISTERING, State.REGISTERED) and self.endpoint.current():
                log.info("registration_current", resource=self.name)
            elif state in UP or state is State.BLOCKED:
                await self._restart()
            # BACKING_OFF: the restart after the backoff registers with that kubelet
        elif isinstance(event, SocketDeleted):
            if state in UP and self.endpoint.socket_present():
                return  # an older socket file of ours: ours is in place
            if state in UP or state is State.BLOCKED:
                await self._restart()
        elif isinstance(event, ServerDown):
            if event.incarnation == self._incarnation and state in UP:
                await self._fail(await self._take_down() or event.reason)
        elif isinstance(event, StreamDropped):
            # The kubelet serving now dropped us (an older stream of the resource ended
            # after we registered): register again at once. A kubelet restart, which
            # ends every stream too, is left to KubeletRestarted.
            mine = event.incarnation == self._incarnation and state is State.REGISTERED
            if mine and self.endpoint.current():
                log.warning("stream_dropped_registering_again", resource=self.name)
                await self._register()
        elif event.step == self._step:
            await self._on_step(event)

    async def _on_step(self, event: RegisterDone | RegisterFailed | TimerDue) -> None:
        state = self.state
        if isinstance(event, RegisterDone) and state is State.REGISTERING:
            self._attempts = 0
            self._counters.registrations += 1
            self._metrics.registered(self.name)
            self._set(State.REGISTERED)
            log.info("resource_registered", resource=self.name)
        elif isinstance(event, RegisterFailed) and state is State.REGISTERING:
            log.warning("register_failed", resource=self.name, error=event.error)
            self._attempts += 1
            self._set(State.SERVING)
            await self._timer(REGISTER_RETRY.delay(self._attempts))
        elif isinstance(event, TimerDue) and state is State.SERVING:
            await self._register()
        elif isinstance(event, TimerDue) and state in (State.BACKING_OFF, State.BLOCKED):
            await self._bring_up()

    def _set(self, state: State) -> None:
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if state not in (State.STARTING, State.REGISTERING):
            self._settled.set()

    async def _restart(self) -> None:
        reason = await self._take_down()
        if reason is None:
            await self._bring_up()
        else:  # it had gone down on its own: a failure, restarted after its backoff
            await self._fail(reason)

    async def _bring_up(self) -> None:
        await self._cancel_step()
        self._set(State.STARTING)
        try:
            await self.endpoint.start()
        except SocketTaken as exc:
            self._blocked += 1
            if self._blocked == 1:
                log.error("plugin_socket_in_use", resource=self.name, error=str(exc))
            self._set(State.BLOCKED)
            await self._timer(REGISTER_RETRY.delay(self._blocked))
            return
        except Exception as exc:  # a server that cannot start is a failure of that server
            await self._stop_endpoint()  # whatever half of it started
            await self._fail(str(exc))
            return
        if self._blocked:
            log.info("plugin_socket_free", resource=self.name)
            self._blocked = 0
        self._incarnation += 1
        self._watch = asyncio.create_task(self._watch_down(self._incarnation))
        self._watch_drops = asyncio.create_task(self._dropped(self._incarnation))
        await self._register()

    async def _take_down(self) -> str | None:
        """Stop the server; returns why, when it had gone down on its own."""
        was_up = self.state in UP
        await self._cancel_step()
        watch, self._watch = self._watch, None
        await _cancelled(watch)
        drops, self._watch_drops = self._watch_drops, None
        await _cancelled(drops)
        await self._stop_endpoint()
        return self.endpoint.down() if was_up else None

    async def _stop_endpoint(self) -> None:
        try:  # a failure to stop must not end the restart that follows
            await self.endpoint.stop()
        except Exception as exc:
            log.error("plugin_stop_failed", resource=self.name, error=str(exc))

    async def _fail(self, reason: str) -> None:
        """Count a failure of the server; restart it after its backoff, or give up."""
        self._counters.server_failures += 1
        self._metrics.server_failed(self.name)
        verdict = after_failure(self._failures, self._timing.clock(), self._budget)
        self._failures, count = verdict.run, verdict.run.count
        if verdict.retry_in_s is None:
            log.error("plugin_server_gave_up", resource=self.name, failures=count, error=reason)
            self._set(State.FAILED)
            self._on_failed(self.name, count, reason)
            return
        log.error(
            "plugin_server_failed",
            resource=self.name,
            failures=count,
            error=reason,
            retry_in_s=verdict.retry_in_s,
        )
        self._set(State.BACKING_OFF)
        await self._timer(verdict.retry_in_s)

    async def _register(self) -> None:
        self._set(State.REGISTERING)
        await self._spawn(self._register_call)

    async def _timer(self, delay: float) -> None:
        async def due(step: int) -> None:
            await self._timing.sleep(delay)
            self._post(TimerDue(step))

        await self._spawn(due)

    async def _spawn(self, work: Callable[[int], Coroutine[Any, Any, None]]) -> None:
        await self._cancel_step()
        self._step_task = asyncio.create_task(work(self._step))

    async def _cancel_step(self) -> None:
        task, self._step_task = self._step_task, None
        self._step += 1  # whatever it posted from now on is stale
        await _cancelled(task)

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

    async def _watch_down(self, incarnation: int) -> None:
        reason = await self.endpoint.wait_down()
        self._post(ServerDown(incarnation, reason))

    async def _dropped(self, incarnation: int) -> None:
        while True:
            await self.endpoint.wait_dropped()
            self._post(StreamDropped(incarnation))


async def _cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` and wait for it to end."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
