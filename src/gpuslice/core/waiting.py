"""One way to wait for the first of several things.

`first_of` runs each coroutine given as a task of its own (one asyncio.TaskGroup), under
one asyncio.timeout, and returns once the first finishes; the rest are cancelled and
awaited before it returns, so nothing it started outlives it. A future (a task the caller
owns) is only watched: never cancelled, its outcome left to its owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
Waitable = Coroutine[Any, Any, object] | asyncio.Future[Any]


async def first_of(*waits: Waitable, timeout_s: float | None = None) -> int | None:
    """The index in `waits` of the first to finish, or None when `timeout_s` passed first.
    A failure of the coroutine that finished first is raised here (after the rest were
    cancelled and awaited)."""
    first: list[int] = []
    failed: list[Exception] = []
    children: list[asyncio.Task[None]] = []

    async def watch(index: int, wait: Waitable) -> None:
        try:
            if isinstance(wait, asyncio.Future):
                await asyncio.wait({wait})
            else:
                await wait
        except Exception as exc:
            failed.append(exc)
        first.append(index)
        for child in children:
            if child is not asyncio.current_task():
                child.cancel()

    try:
        async with asyncio.timeout(timeout_s), asyncio.TaskGroup() as group:
            children.extend(group.create_task(watch(i, w)) for i, w in enumerate(waits))
    except TimeoutError:
        if not first:
            return None
    finally:
        for wait in waits:  # one cancelled before it began: closed, so it never runs
            if not isinstance(wait, asyncio.Future):
                wait.close()
    if failed:
        raise failed[0]
    return first[0]


async def unless_stopped(
    waiting: Coroutine[Any, Any, T], stop: asyncio.Event
) -> asyncio.Task[T] | None:
    """The finished task of `waiting`, or None when `stop` is set first (it is then
    cancelled and awaited). The task's result() returns or raises what `waiting` did."""
    task = asyncio.ensure_future(waiting)
    try:
        await first_of(task, stop.wait())
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task
