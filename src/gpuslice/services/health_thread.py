"""One dedicated thread waiting on backend health events; the loop gets them.

Each wait lasts at most WAIT_S, so stopping takes about that long; `stop()`
awaits the thread's end without blocking the loop. A failing wait is handed to
`on_error` on the loop, then retried after ERROR_BACKOFF_S.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import structlog

from gpuslice.core.devices import HealthEvent
from gpuslice.core.ports import GpuBackend

log = structlog.get_logger("gpuslice.health")

WAIT_S = 0.1  # upper bound on stop latency; events arrive as soon as they happen
ERROR_BACKOFF_S = 1.0


class HealthThread:
    def __init__(
        self,
        backend: GpuBackend,
        on_event: Callable[[HealthEvent], None],
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self._backend = backend
        self._on_event = on_event
        self._on_error = on_error
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._done = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="gpuslice-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        """Stop waiting; returns once the thread has ended (never blocks the loop)."""
        self._stop.set()
        if self._thread.is_alive():
            await self._done.wait()
        if self._thread.ident is not None:
            self._thread.join()

    def __enter__(self) -> HealthThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    event = self._backend.wait_event(WAIT_S)
                except Exception as exc:  # a failing backend must not kill health watching
                    log.error("health_wait_failed", error=str(exc))
                    if self._on_error is not None:
                        self._deliver(self._on_error, exc)
                    self._stop.wait(ERROR_BACKOFF_S)
                    continue
                if event is not None:
                    self._deliver(self._on_event, event)
        finally:
            self._deliver(self._done.set)

    def _deliver(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stop.set()
