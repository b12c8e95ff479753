"""Reading configs off the event loop, bounded in time.

A config is read and parsed on a worker thread, so serving the kubelet never waits on
it; a read still running after READ_TIMEOUT_S is given up (the thread ends on its own:
every read is bounded in size) and refused like a bad config, so the last good one stays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from gpuslice.core.errors import ConfigError

T = TypeVar("T")
READ_TIMEOUT_S = 10.0


async def read_config(
    read: Callable[[], T], timeout_s: float = READ_TIMEOUT_S, *, executor: Executor | None = None
) -> T:
    """read() on a worker thread (of `executor`, else a fresh one). Raises what it raises,
    or ConfigError after `timeout_s`."""
    work = (
        asyncio.to_thread(read)
        if executor is None
        else asyncio.get_running_loop().run_in_executor(executor, read)
    )
    try:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that meets the read's end, and a stopping follower would then never stop.
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        raise ConfigError(f"reading the config took longer than {timeout_s:g}s; refused") from None
