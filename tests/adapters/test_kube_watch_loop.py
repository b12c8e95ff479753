"""The reconnect loop and its backoff, driven by scripted reads and watches (no HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator

import pytest

from gpuslice.adapters.kube.watch import (
    OPENED,
    PROBE_CAP_S,
    RETURN_TRIES,
    SYNCED,
    NodeLabels,
    Retry,
    WatchBroken,
    WatchEvent,
    follow_labels,
)


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

    async def read() -> NodeLabels:
        return NodeLabels({"a": "1"}, "7")

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


ENDED = "ended"  # Script: the watch ends cleanly right after it was answered


class Script:
    """Watches from now, each with a scripted outcome (an exception raised once it was
    answered, or ENDED), the one after them answered and left open; records each
    (version, streaming) asked for."""

    def __init__(self, *outcomes: Exception | str) -> None:
        self.outcomes = list(outcomes)
        self.opened: list[tuple[str | None, bool]] = []
        self.changed = asyncio.Event()

    async def read(self) -> NodeLabels:
        return NodeLabels({"a": "1"}, None)  # no version: the watch starts from now

    async def watch(
        self, version: str | None, streaming: bool
    ) -> AsyncGenerator[WatchEvent[dict[str, str]], None]:
        self.opened.append((version, streaming))
        self.changed.set()
        outcome = self.outcomes.pop(0) if self.outcomes else None
        yield WatchEvent(OPENED, {}, None)
        if isinstance(outcome, Exception):
            raise outcome
        if outcome == ENDED:
            return
        if streaming:
            yield WatchEvent(SYNCED, {}, "9")
        await asyncio.Event().wait()


async def follow_script(script: Script, backoff: CountingRetry) -> None:
    labels = follow_labels("n1", script.read, script.watch, backoff)
    assert await anext(labels) == {"a": "1"}
    waiting = asyncio.ensure_future(anext(labels))
    expected = len(script.outcomes) + 1
    try:
        async with asyncio.timeout(5):
            while len(script.opened) < expected:
                script.changed.clear()
                await script.changed.wait()
    finally:
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting


async def test_a_streaming_list_answered_later_429_or_503_is_asked_for_again() -> None:
    script = Script(WatchBroken("watch: HTTP 429", code=429), WatchBroken("503", code=503))
    backoff = CountingRetry()
    await follow_script(script, backoff)
    assert script.opened == [(None, True)] * 3
    assert backoff.waits == 2  # retried after a wait each time


@pytest.mark.parametrize(
    "refusal",
    [
        WatchBroken("watch: HTTP 500: ...RequestWatchProgress is disabled", code=500),
        WatchBroken("watch: HTTP 422: sendInitialEvents is forbidden", code=422),
        ENDED,
    ],
    ids=["500", "422", "ended-before-its-bookmark"],
)
async def test_a_refused_streaming_list_is_followed_at_once_by_a_plain_watch_from_now(
    refusal: Exception | str,
) -> None:
    script = Script(refusal)
    backoff = CountingRetry()
    await follow_script(script, backoff)
    assert script.opened == [(None, True), (None, False)]
    assert backoff.waits == 0


def test_answered_failures_after_an_outage_wait_within_the_probe_cap_then_back_off() -> None:
    """The server back after an outage long enough to reach the probe cap, and answering
    429 while its watch cache fills: each agent's retries stay within PROBE_CAP_S (spread
    from 0), not at the outage's count of failures on the 30 s schedule; a server that
    keeps failing past RETURN_TRIES gets the doubling again."""
    retry = Retry(0.2, 30.0, rand=random.Random(3))
    for _ in range(30):  # a minute away
        assert 0.0 <= retry.next_delay(unreachable=True) <= PROBE_CAP_S * 1.2
    returning = [retry.next_delay() for _ in range(RETURN_TRIES)]
    assert max(returning) <= PROBE_CAP_S
    assert min(returning) < PROBE_CAP_S / 2  # spread, not in step
    assert retry.next_delay() >= 30.0 * 0.8
    retry.reset()
    assert retry.next_delay() <= 0.2 * 1.2  # a success starts over
