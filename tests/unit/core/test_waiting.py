"""first_of: the first of several waits, with everything it started cancelled and awaited
before it returns (a failure, a timeout or its caller's cancellation too); a caller's own
task is only watched."""

from __future__ import annotations

import asyncio

import pytest

from gpuslice.core.waiting import first_of, unless_stopped


class Waits:
    """Waits that record when they were cancelled and when their clean-up ended."""

    def __init__(self) -> None:
        self.cleaned: list[str] = []

    async def forever(self, name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # clean-up that itself awaits
            self.cleaned.append(name)

    async def on(self, event: asyncio.Event) -> None:
        await event.wait()


async def test_the_index_of_the_first_and_the_rest_cancelled_and_awaited() -> None:
    waits = Waits()
    assert await first_of(waits.forever("a"), asyncio.sleep(0.01), waits.forever("b")) == 1
    assert sorted(waits.cleaned) == ["a", "b"]  # done before first_of returned


async def test_one_cancelled_before_it_began_never_runs() -> None:
    waits, go = Waits(), asyncio.Event()
    go.set()
    late = waits.forever("late")
    assert await first_of(waits.on(go), late) == 0
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        late.send(None)


async def test_a_timeout_is_none_with_everything_cancelled_and_awaited() -> None:
    waits = Waits()
    assert await first_of(waits.forever("a"), waits.forever("b"), timeout_s=0.01) is None
    assert sorted(waits.cleaned) == ["a", "b"]


async def test_the_first_ones_failure_is_raised_after_the_rest_are_cleaned_up() -> None:
    waits = Waits()

    async def fails() -> None:
        raise ValueError("bad read")

    with pytest.raises(ValueError, match="bad read"):
        await first_of(waits.forever("a"), fails())
    assert waits.cleaned == ["a"]


async def test_a_callers_task_is_watched_never_cancelled() -> None:
    waits, go = Waits(), asyncio.Event()
    owned = asyncio.create_task(waits.forever("owned"))
    go.set()
    assert await first_of(owned, waits.on(go)) == 1
    assert not owned.done()
    owned.cancel()
    await asyncio.gather(owned, return_exceptions=True)

    ended = asyncio.create_task(asyncio.sleep(0))
    assert await first_of(ended, waits.forever("a")) == 0
    assert waits.cleaned[-1] == "a"


async def test_cancelling_the_caller_cancels_and_awaits_what_it_started() -> None:
    waits = Waits()
    waiting = asyncio.create_task(first_of(waits.forever("a"), waits.forever("b")))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert sorted(waits.cleaned) == ["a", "b"]


async def test_unless_stopped_gives_the_finished_task_or_none_once_stopped() -> None:
    waits, stop = Waits(), asyncio.Event()

    async def answer() -> int:
        return 7

    done = await unless_stopped(answer(), stop)
    assert done is not None
    assert done.result() == 7
    stop.set()
    assert await unless_stopped(waits.forever("a"), stop) is None
    assert waits.cleaned == ["a"]
