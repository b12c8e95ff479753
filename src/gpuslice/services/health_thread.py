"""One dedicated thread waiting on backend health events; the loop gets them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType

import structlog

from gpuslice.core.devices import HealthEvent
from gpuslice.core.ports import GpuBackend

log = structlog.get_logger("gpuslice.health")

WAIT_S = 0.25  # upper bound on stop latency; events arrive as soon as they happen


class HealthThread:
    def __init__(self, backend: GpuBackend, on_event: Callable[[HealthEvent], None]) -> None:
        self._backend = backend
        self._on_event = on_event
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuslice-health", daemon=True)

    def __enter__(self) -> HealthThread:
        self._thread.start()
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
        while not self._stop.is_set():
            try:
                event = self._backend.wait_event(WAIT_S)
            except Exception as exc:  # a failing backend must not kill health watching
                log.error("health_wait_failed", error=str(exc))
                self._stop.wait(1.0)
                continue
            if event is not None:
                self._loop.call_soon_threadsafe(self._on_event, event)
