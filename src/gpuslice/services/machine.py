"""The one idiom of every supervisor: an explicit state machine fed by events.

Events are handled one at a time by the machine's own task, so transitions never
interleave. What waits on the outside (a call, a backoff, a process's exit) runs as the
machine's *step*: a task of its own that only posts an event carrying the step it
belongs to. Starting another step cancels the one before, and an event of a step since
superseded is dropped by the handler (`current`). The machine's task ends once its
state is the final one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

log = structlog.get_logger("gpuslice.supervision")

S = TypeVar("S")
Step = Callable[[int], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class TimerDue:
    step: int


class Machine(Generic[S]):
    def __init__(self, name: str, initial: S, final: S) -> None:
        self.name = name
        self.state = initial
        self._final = final
        self._step = 0  # the current step
        self._step_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()  # set, and replaced, on each change of state
        self._queue: asyncio.Queue[tuple[object, asyncio.Future[None] | None]] = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def handle(self, event: object) -> None:
        """Handle one event (the subclass's transitions)."""
        raise NotImplementedError

    async def send(self, event: object) -> None:
        """Hand `event` to the machine and return once it was handled."""
        if self._task.done():
            return
        done = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, done))
        await done

    def post(self, event: object) -> None:
        """Hand `event` to the machine without waiting for it."""
        self._queue.put_nowait((event, None))

    async def reached(self, *states: S) -> S:
        """Return the state once it is one of `states`."""
        while self.state not in states:
            await self._changed.wait()
        return self.state

    async def join(self) -> None:
        """Return once the machine's task has ended (its state is the final one)."""
        await self._task

    def set(self, state: S) -> None:
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def current(self, step: int) -> bool:
        return step == self._step

    async def spawn(self, work: Step) -> None:
        """Run `work(step)` as the machine's step, cancelling the one before."""
        await self.cancel_step()
        self._step_task = asyncio.create_task(work(self._step))

    async def timer(self, delay: float, sleep: Callable[[float], Awaitable[None]]) -> None:
        """A step that posts TimerDue after `delay`."""

        async def due(step: int) -> None:
            await sleep(delay)
            self.post(TimerDue(step))

        await self.spawn(due)

    async def cancel_step(self) -> None:
        task, self._step_task = self._step_task, None
        self._step += 1  # whatever it posted from now on is stale
        await cancelled(task)

    async def _run(self) -> None:
        while self.state != self._final:
            event, done = await self._queue.get()
            try:
                await self.handle(event)
            except Exception as exc:
                if done is None or done.done():
                    log.error("supervisor_event_failed", name=self.name, error=repr(exc))
                else:
                    done.set_exception(exc)
                continue
            if done is not None and not done.done():
                done.set_result(None)
        await self.cancel_step()
        while not self._queue.empty():  # sent after the end: nothing left to do
            _, done = self._queue.get_nowait()
            if done is not None and not done.done():
                done.set_result(None)


async def cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` and wait for it to end."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
