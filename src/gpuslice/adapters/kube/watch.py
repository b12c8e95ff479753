"""Follow one Node's labels: a full read first, then a watch that survives failures.

The loop knows nothing about HTTP: it gets a `read` (full GET of the Node) and an
`open_watch(resource_version)` (one watch request, as an async iterator of events
that raises WatchGone or WatchBroken). Rules, as a client-go reflector does them:

- the first read's failure propagates (BackendError) so the caller learns at once;
- the watch starts from the read's resourceVersion; BOOKMARK events only move it;
- a watch the server ends cleanly (its timeoutSeconds) resumes from the last version;
- 410 Gone or a broken watch: back off, re-read fully (retrying until it works), resume;
- labels are yielded only when they differ from the last ones yielded; a deleted Node is {}.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import structlog

from gpuslice.core.errors import BackendError

_log = structlog.get_logger()

BOOKMARK = "BOOKMARK"
DELETED = "DELETED"
_QUIET_END_S = 1.0  # a watch ending empty sooner than this counts as a failure


@dataclass(frozen=True)
class NodeState:
    """What a full read returns; resource_version None when the Node does not exist."""

    labels: dict[str, str]
    resource_version: str | None


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    labels: dict[str, str]
    resource_version: str | None


class WatchGone(Exception):  # noqa: N818 - named after HTTP 410 Gone
    """The watched resourceVersion is too old (410 Gone): a full re-read is needed."""


class WatchBroken(Exception):  # noqa: N818 - a state, like the HTTP terms above
    """The watch failed (connection dropped, server error); the message is one line."""


class Backoff:
    """Exponential delay with jitter between failed attempts; reset after a success."""

    def __init__(self, initial_s: float, cap_s: float) -> None:
        self.initial_s = initial_s
        self.cap_s = cap_s
        self._next_s = initial_s

    def next_delay(self) -> float:
        delay = self._next_s * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not secrecy
        self._next_s = min(self._next_s * 2, self.cap_s)
        return delay

    async def wait(self) -> None:
        await asyncio.sleep(self.next_delay())

    def reset(self) -> None:
        self._next_s = self.initial_s


ReadNode = Callable[[], Awaitable[NodeState]]
OpenWatch = Callable[[str | None], AsyncGenerator[WatchEvent, None]]


async def follow_labels(
    node: str, read: ReadNode, open_watch: OpenWatch, backoff: Backoff
) -> AsyncGenerator[dict[str, str], None]:
    """Yield the Node's labels after the first full read, then on every change."""
    state = await read()
    last = state.labels
    version = state.resource_version
    yield dict(last)
    loop = asyncio.get_running_loop()
    while True:
        try:
            started = loop.time()
            delivered = False
            async with contextlib.aclosing(open_watch(version)) as events:
                async for event in events:
                    delivered = True
                    backoff.reset()
                    version = event.resource_version or version
                    if event.type == BOOKMARK:
                        continue
                    labels = {} if event.type == DELETED else event.labels
                    if labels != last:
                        last = labels
                        yield dict(labels)
            # A clean end (the server's timeoutSeconds) resumes at once, unless the
            # watch ended empty right away: that must not become a busy loop.
            if not delivered and loop.time() - started < _QUIET_END_S:
                await backoff.wait()
            continue
        except WatchGone:
            _log.info("node_watch_expired", node=node, resource_version=version)
        except WatchBroken as exc:
            _log.warning("node_watch_broken", node=node, error=str(exc))
        state = await _read_until_ok(node, read, backoff)
        version = state.resource_version
        if state.labels != last:
            last = state.labels
            yield dict(last)


async def _read_until_ok(node: str, read: ReadNode, backoff: Backoff) -> NodeState:
    while True:
        await backoff.wait()
        try:
            state = await read()
        except BackendError as exc:
            _log.warning("node_read_failed", node=node, error=str(exc))
            continue
        _log.info("node_watch_resumed", node=node, resource_version=state.resource_version)
        return state
