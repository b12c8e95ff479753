"""Follow one object (a Node, a ConfigMap): a full read first, then a watch that survives failures.

The loop knows nothing about HTTP: it gets a `read` (full GET of the object) and an
`open_watch(resource_version, streaming)` (one watch request, as an async iterator of
events that raises WatchGone or WatchBroken). Rules, as a client-go reflector does them:

- the first read's failure propagates (BackendError) so the caller learns at once;
- the watch starts from the read's resourceVersion; BOOKMARK events only move it;
- a watch the server ends cleanly (its timeoutSeconds) resumes from the last version;
- 410 Gone or a broken watch: back off, re-read fully (retrying until it works), resume;
  a watch answered "later" (429, 503) is asked for again after the back-off, unread;
- 410 Gone for the version a re-read gave (nothing delivered since): the server's watch
  cache starts after that version, as after an API server restart while the object stood
  unchanged; re-reading gives the same version again, so the watch starts from now
  instead, as a streaming list (sendInitialEvents): the server sends the object as it
  is (ADDED), whose own version is not resumed from (it is as old), then the bookmark
  that ends the initial events (SYNCED), whose version is;
- a streaming list the server refuses (any answer but "later", 429 or 503: an API
  server over etcd 3.4 answers an ERROR 500; or an end before SYNCED) is not asked for
  again by this follower: it watches from now without it, at once and from then on:
  the list and the watch in one request (the object as ADDED, then its changes; no
  `list` verb needed), as client-go's reflector falls back to LIST and WATCH;
- retries wait as Retry says: jittered, doubling up to a cap; short while the server does
  not answer and just after it answers again, so the watches return within seconds of
  the server's return;
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
from gpuslice.core.restart import Backoff, jittered, spread

_log = structlog.get_logger()

T = TypeVar("T")
ADDED = "ADDED"
BOOKMARK = "BOOKMARK"
DELETED = "DELETED"
OPENED = "OPENED"  # not from the server: the watch request was answered 200
SYNCED = "SYNCED"  # the BOOKMARK that ends a streaming list's initial events
_QUIET_END_S = 1.0  # a watch ending empty sooner than this counts as a failure


@dataclass(frozen=True)
class FullRead(Generic[T]):
    """What a full read returns; resource_version None when the object does not exist."""

    value: T
    resource_version: str | None


@dataclass(frozen=True)
class WatchEvent(Generic[T]):
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK, or OPENED
    value: T
    resource_version: str | None


NodeLabels = FullRead[dict[str, str]]  # a Node's labels


class WatchGone(Exception):  # noqa: N818 - named after HTTP 410 Gone
    """The watched resourceVersion is too old (410 Gone): a full re-read is needed."""


class WatchBroken(Exception):  # noqa: N818 - a state, like the HTTP terms above
    """The watch failed (connection dropped, server error); the message is one line.
    `unreachable`: no answer at all (refused, timed out, cut before an answer); `code`:
    the HTTP status the server answered with, when it did."""

    def __init__(self, message: str, *, unreachable: bool = False, code: int = 0) -> None:
        super().__init__(message)
        self.unreachable = unreachable
        self.code = code

    @property
    def later(self) -> bool:
        """The server answered "not now" (429, 503: a starting server's watch cache)."""
        return self.code in _LATER

    @property
    def refusal(self) -> bool:
        """An answer that refuses the request itself."""
        return not self.unreachable and not self.later


class Unreachable(BackendError):  # noqa: N818 - a state
    """A read the server did not answer at all (always transient)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


# A watch's timeoutSeconds is drawn from this range (client-go's reflector: 5-10 min).
WATCH_TIMEOUT_S = (300, 600)
_LATER = (429, 503)  # answers that say "not now" (a starting server's watch cache)
# A server that does not answer is probed again within this (full jitter); so are the
# first RETURN_TRIES answered failures after it did not answer.
PROBE_CAP_S = 2.0
RETURN_TRIES = 10


class Retry:
    """The wait before each retry of a run of failures; reset after a success.

    - the server answered (5xx, 429, 403): core.restart's doubling Backoff from
      `initial_s` to `cap_s`, jittered (so many agents do not retry in step);
    - no answer at all (refused, timed out): anywhere within the same doubling capped at
      `probe_cap_s` (full jitter): a refused connection costs the server nothing;
    - answered failures just after unanswered ones (the server is coming back, its watch
      cache filling): anywhere within `probe_cap_s` (full jitter), for `return_tries`
      of them, so every agent is back within that of the server's readiness and the
      fleet's retries are spread evenly over it; then the doubling resumes (counted
      from those failures, not the outage's) for a server that came back broken.
    """

    def __init__(
        self,
        initial_s: float,
        cap_s: float,
        *,
        probe_cap_s: float = PROBE_CAP_S,
        return_tries: int = RETURN_TRIES,
        rand: random.Random | None = None,
    ) -> None:
        self.schedule = Backoff(initial_s, cap_s)
        self.probe = Backoff(min(initial_s, probe_cap_s), probe_cap_s)
        self.return_tries = return_tries
        self.failures = 0  # answered, in a row (since the last unanswered one)
        self.probes = 0  # unanswered, in a row
        self._returning = 0  # answered failures left to wait out within probe_cap_s
        self._rand = rand or random.Random()  # noqa: S311 - jitter, not secrecy

    def next_delay(self, *, unreachable: bool = False) -> float:
        if unreachable:
            self.probes += 1
            self.failures, self._returning = 0, self.return_tries
            return spread(self.probe.delay(self.probes), self._rand.uniform)
        self.probes = 0
        self.failures += 1
        if self._returning:
            self._returning -= 1
            return spread(self.probe.max_s, self._rand.uniform)
        return jittered(self.schedule.delay(self.failures), self._rand.uniform)

    async def wait(self, *, unreachable: bool = False) -> None:
        await asyncio.sleep(self.next_delay(unreachable=unreachable))

    def reset(self) -> None:
        self.failures = self.probes = self._returning = 0


@dataclass(frozen=True)
class Watched:
    """What is followed, for log lines: kind (node, configmap) and name."""

    kind: str
    name: str


Read = Callable[[], Awaitable[FullRead[T]]]
# open_watch(version, streaming): one watch request from `version`; from now when None,
# as a streaming list when `streaming`.
OpenWatch = Callable[[str | None, bool], AsyncGenerator[WatchEvent[T], None]]


async def follow(
    what: Watched, read: Read[T], open_watch: OpenWatch[T], backoff: Retry, gone: T
) -> AsyncGenerator[tuple[T, str | None], None]:
    """Yield (value, trouble) after the first full read, then whenever either changes;
    trouble is None while the watch works, else one line saying why it does not."""
    state = await read()
    last, trouble = state.value, None
    version = state.resource_version
    fresh = False  # `version` is a re-read's, nothing delivered since
    streaming = True  # from now is a streaming list, until the server refuses one
    yield last, trouble
    loop = asyncio.get_running_loop()
    log = _log.bind(**{what.kind: what.name})
    unreachable = False  # how the last failure failed: no answer at all
    while True:
        from_now = version is None
        synced = not (from_now and streaming)  # a streaming list's initial events ended
        try:
            started = loop.time()
            delivered = False
            async with contextlib.aclosing(open_watch(version, streaming)) as events:
                async for event in events:
                    if event.type == OPENED:
                        if trouble is not None:
                            trouble = None
                            yield last, trouble
                        continue
                    delivered = True
                    backoff.reset()
                    synced = synced or event.type == SYNCED
                    if not (from_now and event.type == ADDED):  # the object as it stands
                        version, fresh = event.resource_version or version, False
                    if event.type in (BOOKMARK, SYNCED):
                        continue
                    value = gone if event.type == DELETED else event.value
                    if value != last:
                        last = value
                        yield last, trouble
            if not synced:
                raise WatchBroken("the streaming list ended before its initial events did")
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
            if not synced and exc.refusal:  # once: then from now without streaming
                log.warning(f"{what.kind}_watch_list_refused", error=str(exc))
                streaming = False
                continue
            log.warning(f"{what.kind}_watch_broken", error=str(exc))
            unreachable = exc.unreachable
            if trouble != str(exc):
                trouble = str(exc)
                yield last, trouble
            if exc.later:  # the same watch again: nothing was missed that a read would give
                await backoff.wait()
                continue
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
