"""One supervision idiom for whatever the node keeps running (a device-plugin server, an
MPS control daemon): an explicit state machine fed by events.

    NEW --start--> STARTING --started--> up (RUNNING, or a subclass's own up states)
                     ^   | cannot start             | went down on its own
                     |   v                          v
                     +-- BACKING_OFF <--------------+
                           | restart budget spent: FAILED;   stop (any state): STOPPED

Events are handled one at a time by the supervisor's own task, so transitions never
interleave. What waits on the outside (a backoff timer, the target's crash watch, a
subclass's own calls) runs in a task of its own that only posts an event carrying the
step or incarnation it belongs to; an event from work since superseded is dropped. The
restart budget and backoffs are core.restart's rules; the clock and sleep come in
Timing, so tests bring their own.

A target is anything with start / down / wait_down / stop (`Supervised`). A subclass
(frontends.deviceplugin.supervisor: registration with the kubelet) adds states (its own
subclass of State) and events by overriding `_after_start`, `_start_failed` and
`_handle_more`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import structlog

from gpuslice.core.restart import FailureRun, RestartBudget, after_failure

log = structlog.get_logger("gpuslice.supervision")


class Supervised(Protocol):
    """What a supervisor keeps running."""

    async def start(self) -> None:
        """Start it; raises when it cannot start (a failure, restarted after a backoff)."""
        ...

    def down(self) -> str | None:
        """Why it stopped on its own since start(), or None."""
        ...

    async def wait_down(self) -> str:
        """Return why, once it stopped on its own (call after start)."""
        ...

    async def stop(self) -> None:
        """Stop it; never raises for one already down."""
        ...


class State:
    """One state of a supervisor: its name (`value`), and whether the target serves in it.
    The base machine's states are this class's; a subclass's own states are its own
    (a subclass of State with more of them), so the base names none of them."""

    __slots__ = ("up", "value")
    NEW: ClassVar[State]
    STARTING: ClassVar[State]
    RUNNING: ClassVar[State]  # up, for a target with nothing to do after its start
    BACKING_OFF: ClassVar[State]  # it failed: started again after a backoff
    STOPPED: ClassVar[State]
    FAILED: ClassVar[State]  # the restart budget is spent

    def __init__(self, value: str, *, up: bool = False) -> None:
        self.value, self.up = value, up

    def __repr__(self) -> str:
        return f"<State {self.value}>"


State.NEW = State("new")
State.STARTING = State("starting")
State.RUNNING = State("running", up=True)
State.BACKING_OFF = State("backing_off")
State.STOPPED = State("stopped")
State.FAILED = State("failed")


@dataclass(frozen=True)
class Start: ...


@dataclass(frozen=True)
class Stop: ...


@dataclass(frozen=True)
class ServerDown:
    """The target stopped on its own (its crash watch)."""

    incarnation: int
    reason: str


@dataclass(frozen=True)
class TimerDue:
    step: int


@dataclass(frozen=True)
class Timing:
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]]


OnFailed = Callable[[str, int, str], None]  # (name, failures, last reason): budget spent


class Supervisor:
    """Keeps one target running; see the module doc."""

    _log = log
    _key = "target"  # the log field that names the target

    def __init__(
        self,
        name: str,
        target: Supervised,
        *,
        budget: RestartBudget,
        timing: Timing,
        on_failed: OnFailed | None = None,
        on_state: Callable[[State], None] | None = None,  # told each new state, at once
    ) -> None:
        self.name = name
        self.target = target
        self.state = State.NEW
        self._budget, self._timing = budget, timing
        self._on_failed = on_failed
        self._on_state = on_state
        self._failures = FailureRun()
        self._step = 0  # the current step: a timer, or a subclass's call
        self._step_task: asyncio.Task[None] | None = None
        self._incarnation = 0  # the target started last
        self._watch: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()  # the first start ended one way or another
        self._changed = asyncio.Event()  # set, and replaced, on each change of state
        self._queue: asyncio.Queue[tuple[object, asyncio.Future[None] | None]] = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def start(self) -> None:
        """Start, and return once the first start settled (see `_settles`)."""
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

    async def send(self, event: object) -> None:
        """Hand `event` to the supervisor and return once it was handled."""
        if self._task.done():
            return
        done = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, done))
        await done

    def _post(self, event: object) -> None:
        self._queue.put_nowait((event, None))

    async def _run(self) -> None:
        while self.state is not State.STOPPED:
            event, done = await self._queue.get()
            try:
                await self._handle(event)
            except Exception as exc:
                if done is None or done.done():
                    self._log.error(
                        "supervisor_event_failed", **{self._key: self.name}, error=repr(exc)
                    )
                else:
                    done.set_exception(exc)
                continue
            if done is not None and not done.done():
                done.set_result(None)
        while not self._queue.empty():  # sent after the stop: nothing left to do
            _, done = self._queue.get_nowait()
            if done is not None and not done.done():
                done.set_result(None)

    async def _handle(self, event: object) -> None:
        state = self.state
        if isinstance(event, Stop):
            await self._take_down()
            self._set(State.STOPPED)
        elif state in (State.STOPPED, State.FAILED):
            return
        elif isinstance(event, Start):
            if state is State.NEW:
                await self._bring_up()
        elif isinstance(event, ServerDown):
            if event.incarnation == self._incarnation and state.up:
                await self._fail(await self._take_down() or event.reason)
        elif isinstance(event, TimerDue) and event.step != self._step:
            return  # superseded
        elif isinstance(event, TimerDue) and state is State.BACKING_OFF:
            await self._bring_up()
        else:
            await self._handle_more(event)

    # --- what a subclass refines ------------------------------------------------------

    async def _handle_more(self, event: object) -> None:
        """An event the base does not handle (a subclass's own, a timer in its states)."""

    async def _after_start(self) -> None:
        """The target started: what follows (the base: it runs)."""
        self._set(State.RUNNING)

    async def _start_failed(self, exc: Exception) -> bool:
        """The target could not start; True when handled here (the base: never)."""
        return False

    def _settles(self, state: State) -> bool:
        """Whether reaching `state` ends start()'s wait."""
        return state is not State.STARTING

    def _failed(self, reason: str, failures: int, retry_in_s: float | None) -> None:
        """A failure was counted: retried after `retry_in_s`, or None: given up."""
        if retry_in_s is None:
            log.error("supervised_gave_up", target=self.name, failures=failures, error=reason)
        else:
            log.error("supervised_failed", target=self.name, failures=failures,
                      error=reason, retry_in_s=retry_in_s)  # fmt: skip

    def _stop_failed(self, exc: Exception) -> None:
        log.error("supervised_stop_failed", target=self.name, error=str(exc))

    # --- the shared machinery ---------------------------------------------------------

    def _set(self, state: State) -> None:
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if self._settles(state):
            self._settled.set()
        if self._on_state is not None:
            self._on_state(state)

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
            await self.target.start()
        except Exception as exc:
            if await self._start_failed(exc):
                return
            await self._stop_target()  # whatever half of it started
            await self._fail(str(exc))
            return
        self._incarnation += 1
        self._watch = asyncio.create_task(self._watch_down(self._incarnation))
        await self._after_start()

    async def _take_down(self) -> str | None:
        """Stop the target; returns why, when it had gone down on its own."""
        was_up = self.state.up
        await self._cancel_step()
        watch, self._watch = self._watch, None
        await _cancelled(watch)
        await self._stop_target()
        return self.target.down() if was_up else None

    async def _stop_target(self) -> None:
        try:  # a failure to stop must not end the restart that follows
            await self.target.stop()
        except Exception as exc:
            self._stop_failed(exc)

    async def _fail(self, reason: str) -> None:
        """Count a failure; start again after its backoff, or give up."""
        verdict = after_failure(self._failures, self._timing.clock(), self._budget)
        self._failures, count = verdict.run, verdict.run.count
        self._failed(reason, count, verdict.retry_in_s)
        if verdict.retry_in_s is None:
            self._set(State.FAILED)
            if self._on_failed is not None:
                self._on_failed(self.name, count, reason)
            return
        self._set(State.BACKING_OFF)
        await self._timer(verdict.retry_in_s)

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

    async def _watch_down(self, incarnation: int) -> None:
        reason = await self.target.wait_down()
        self._post(ServerDown(incarnation, reason))


async def _cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` and wait for it to end."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
