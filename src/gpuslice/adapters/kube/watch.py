"""Follow one object (a Node, a ConfigMap): a full read first, then a watch that survives failures.

The loop knows nothing about HTTP: it gets a `read` (full GET of the object) and an
`open_watch(resource_version)` (one watch request, as an async iterator of events
that raises WatchGone or WatchBroken). Rules, as a client-go reflector does them:

- the first read's failure propagates (BackendError) so the caller learns at once;
- the watch starts from the read's resourceVersion; BOOKMARK events only move it;
- a watch the server ends cleanly (its timeoutSeconds) resumes from the last version;
- 410 Gone or a broken watch: back off, re-read fully (retrying until it works), resume;
- 410 Gone for the version a re-read gave (nothing delivered since): the server's watch
  cache starts after that version, as after an API server restart while the object stood
  unchanged; re-reading gives the same version again, so the watch starts from now
  instead (no resourceVersion): the server sends the object as it is (ADDED), whose own
  version is not resumed from (it is as old), only later events' and bookmarks';
- retries back off with jitter, doubling up to a cap; a server that does not answer at
  all (connection refused, timed out) is retried up to a short cap only, as such a probe
  costs it nothing, so the watches return within seconds of the server's return;
- a value is yielded only when it differs from the last one yielded; a deleted object
  is `gone`.

follow() also yields the trouble it is in: from a broken watch or failed re-read until a
watch request is answered again (the OPENED event), so a caller can say its view is stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from gpuslice.core.errors import BackendError
from gpuslice.core.restart import Backoff, jittered

_log = structlog.get_logger()

T = TypeVar("T")
ADDED = "ADDED"
BOOKMARK = "BOOKMARK"
DELETED = "DELETED"
OPENED = "OPENED"  # not from the server: the watch request was answered 200
_QUIET_END_S = 1.0  # a watch ending empty sooner than this counts as a failure


@dataclass(frozen=True)
class State(Generic[T]):
    """What a full read returns; resource_version None when the object does not exist."""

    value: T
    resource_version: str | None


@dataclass(frozen=True)
class WatchEvent(Generic[T]):
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK, or OPENED
    value: T
    resource_version: str | None


NodeState = State[dict[str, str]]  # a Node's labels


class WatchGone(Exception):  # noqa: N818 - named after HTTP 410 Gone
    """The watched resourceVersion is too old (410 Gone): a full re-read is needed."""


class WatchBroken(Exception):  # noqa: N818 - a state, like the HTTP terms above
    """The watch failed (connection dropped, server error); the message is one line.
    `unreachable`: no answer at all (refused, timed out, cut before an answer)."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class Unreachable(BackendError):  # noqa: N818 - a state
    """A read the server did not answer at all (always transient)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


# A watch's timeoutSeconds is drawn from this range (client-go's reflector: 5-10 min).
WATCH_TIMEOUT_S = (300, 600)
# A server that does not answer is probed again at most this far apart (jittered).
PROBE_CAP_S = 2.0


class Retry:
    """Failed attempts in a row, waited out on core.restart's doubling Backoff with
    jitter (so many agents do not retry in step); reset after a success. A failure with
    no answer at all waits at most `probe_cap_s` (jittered too)."""

    def __init__(
        self,
        initial_s: float,
        cap_s: float,
        *,
        probe_cap_s: float = PROBE_CAP_S,
        rand: random.Random | None = None,
    ) -> None:
        self.schedule = Backoff(initial_s, cap_s)
        self.probe = Backoff(min(initial_s, probe_cap_s), probe_cap_s)
        self.failures = 0
        self._rand = rand or random.Random()  # noqa: S311 - jitter, not secrecy

    def next_delay(self, *, unreachable: bool = False) -> float:
        self.failures += 1
        schedule = self.probe if unreachable else self.schedule
        return jittered(schedule.delay(self.failures), self._rand.uniform)

    async def wait(self, *, unreachable: bool = False) -> None:
        await asyncio.sleep(self.next_delay(unreachable=unreachable))

    def reset(self) -> None:
        self.failures = 0


@dataclass(frozen=True)
class Watched:
    """What is followed, for log lines: kind (node, configmap) and name."""

    kind: str
    name: str


Read = Callable[[], Awaitable[State[T]]]
OpenWatch = Callable[[str | None], AsyncGenerator[WatchEvent[T], None]]


async def follow(
    what: Watched, read: Read[T], open_watch: OpenWatch[T], backoff: Retry, gone: T
) -> AsyncGenerator[tuple[T, str | None], None]:
    """Yield (value, trouble) after the first full read, then whenever either changes;
    trouble is None while the watch works, else one line saying why it does not."""
    state = await read()
    last, trouble = state.value, None
    version = state.resource_version
    fresh = False  # `version` is a re-read's, nothing delivered since
    yield last, trouble
    loop = asyncio.get_running_loop()
    log = _log.bind(**{what.kind: what.name})
    unreachable = False  # how the last failure failed: no answer at all
    while True:
        try:
            started = loop.time()
            delivered = False
            from_now = version is None
            async with contextlib.aclosing(open_watch(version)) as events:
                async for event in events:
                    if event.type == OPENED:
                        if trouble is not None:
                            trouble = None
                            yield last, trouble
                        continue
                    delivered = True
                    backoff.reset()
                    if not (from_now and event.type == ADDED):  # the object as it stands
                        version, fresh = event.resource_version or version, False
                    if event.type == BOOKMARK:
                        continue
                    value = gone if event.type == DELETED else event.value
                    if value != last:
                        last = value
                        yield last, trouble
            # A clean end (the server's timeoutSeconds) resumes at once, unless the
            # watch ended empty right away: that must not become a busy loop.
            if not delivered and loop.time() - started < _QUIET_END_S:
                await backoff.wait()
            continue
        except WatchGone:
            if fresh:  # the server's cache starts after the read's version: watch from now
                log.info(f"{what.kind}_watch_from_now", resource_version=version)
                version, fresh = None, False
                continue
            log.info(f"{what.kind}_watch_expired", resource_version=version)
        except WatchBroken as exc:
            log.warning(f"{what.kind}_watch_broken", error=str(exc))
            unreachable = exc.unreachable
            if trouble != str(exc):
                trouble = str(exc)
                yield last, trouble
        while True:  # re-read until it works
            await backoff.wait(unreachable=unreachable)
            try:
                state = await read()
                break
            except BackendError as exc:
                log.warning(f"{what.kind}_read_failed", error=str(exc))
                unreachable = isinstance(exc, Unreachable)
                if trouble != str(exc):
                    trouble = str(exc)
                    yield last, trouble
        unreachable = False
        log.info(f"{what.kind}_watch_resumed", resource_version=state.resource_version)
        version = state.resource_version
        fresh = version is not None
        if state.value != last:
            last = state.value
            yield last, trouble


def follow_labels(
    node: str,
    read: Read[dict[str, str]],
    open_watch: OpenWatch[dict[str, str]],
    backoff: Retry,
) -> AsyncGenerator[dict[str, str], None]:
    """Yield the Node's labels after the first full read, then on every change."""
    nothing: dict[str, str] = {}
    return labels_of(follow(Watched("node", node), read, open_watch, backoff, nothing))


async def labels_of(
    items: AsyncGenerator[tuple[dict[str, str], str | None], None],
) -> AsyncGenerator[dict[str, str], None]:
    """The labels of follow()'s (labels, trouble) pairs, each time they change."""
    last: dict[str, str] | None = None
    async with contextlib.aclosing(items):
        async for labels, _trouble in items:
            if labels != last:
                last = labels
                yield dict(labels)
