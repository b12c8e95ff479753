"""The reconnect loop and its backoff, driven by scripted reads and watches (no HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from gpuslice.adapters.kube.watch import NodeState, Retry, WatchEvent, follow_labels


class CountingRetry(Retry):
    """Counts waits and yields to the loop instead of sleeping."""

    def __init__(self) -> None:
        super().__init__(0.2, 30.0)
        self.waits = 0

    async def wait(self, *, unreachable: bool = False) -> None:
        self.waits += 1
        await asyncio.sleep(0)


def test_retry_doubles_up_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Retry(0.2, 1.0)
    bases = [0.2, 0.4, 0.8, 1.0, 1.0]
    for base in bases:
        assert base * 0.8 <= backoff.next_delay() <= base * 1.2
    backoff.reset()
    assert 0.16 <= backoff.next_delay() <= 0.24


async def test_a_watch_that_ends_empty_at_once_backs_off_before_every_retry() -> None:
    opened: list[str | None] = []
    fifth = asyncio.Event()

    async def read() -> NodeState:
        return NodeState({"a": "1"}, "7")

    async def empty_watch(
        version: str | None, streaming: bool
    ) -> AsyncGenerator[WatchEvent[dict[str, str]], None]:
        opened.append(version)
        if len(opened) == 5:
            fifth.set()
            await asyncio.Event().wait()  # stays open from here on
        return
        yield  # an async generator that ends without events

    backoff = CountingRetry()
    labels = follow_labels("n1", read, empty_watch, backoff)
    assert await anext(labels) == {"a": "1"}
    waiting = asyncio.ensure_future(anext(labels))
    await fifth.wait()
    assert opened == ["7"] * 5  # resumed from the read's version, never re-read
    assert backoff.waits == 4  # one wait between each pair of opens: no busy loop
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
