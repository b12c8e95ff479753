"""Waiting for something unless a stop comes first."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def unless_stopped(
    waiting: Coroutine[Any, Any, T], stop: asyncio.Event
) -> asyncio.Task[T] | None:
    """The finished task of `waiting`, or None when `stop` is set first (it is then
    cancelled). The task's result() returns or raises what `waiting` did."""
    task = asyncio.ensure_future(waiting)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, stopping):
            pending.cancel()
        await asyncio.gather(task, stopping, return_exceptions=True)
    return None if task.cancelled() else task
