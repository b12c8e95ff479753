"""Waiting out the Kubernetes API at start: a first read that fails (the server slow, away,
erring or refusing) is tried again, with jittered doubling back-off, until it works or the
agent is stopped. The agent never exits for it.

While it waits, `waiting` is told why (the readiness detail: the last error, the attempt,
the next try); the log has one line per kind of failure in a row (a new error text), not
one per attempt, and one line when the read finally worked.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from gpuslice.core.errors import BackendError
from gpuslice.core.restart import API_FIRST_READ, Backoff, jittered

log = structlog.get_logger("gpuslice.config")

T = TypeVar("T")


@dataclass(frozen=True)
class ApiWait:
    """How a first read is retried; tests inject `sleep`, `clock` and `draw`."""

    backoff: Backoff = API_FIRST_READ
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic
    draw: Callable[[float, float], float] = field(
        default_factory=lambda: random.Random().uniform  # noqa: S311 - jitter, not secrecy
    )


async def until_read(
    read: Callable[[], Awaitable[T]], what: str, waiting: Callable[[str], None], wait: ApiWait
) -> T:
    """`read()`'s result, once it does not raise BackendError."""
    attempt, logged, began = 0, "", wait.clock()
    while True:
        try:
            result = await read()
        except BackendError as exc:
            attempt += 1
            error, delay = str(exc), jittered(wait.backoff.delay(attempt), wait.draw)
            if error != logged:  # a new kind of failure: one line, not one per attempt
                logged = error
                log.warning("api_first_read_waiting", reading=what, error=error,
                            attempt=attempt, retry_in_s=round(delay, 2))  # fmt: skip
            waiting(
                f"waiting for the Kubernetes API to read {what} (attempt {attempt}, "
                f"next in {delay:.1f} s): {error}"
            )
            await wait.sleep(delay)
            continue
        if attempt:
            log.info("api_first_read_done", reading=what, attempts=attempt + 1,
                     waited_s=round(wait.clock() - began, 2))  # fmt: skip
        return result
