"""The shell of every collector that reads the agent's state at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import structlog
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = structlog.get_logger("gpuslice.metrics")

T = TypeVar("T")


class ScrapeCollector(Collector, Generic[T]):
    """Calls `read` at each scrape and renders what it returns. A failing read leaves this
    collector's series out and is logged as `event`: a scrape never fails for it."""

    event = "metrics_read_failed"

    def __init__(self, read: Callable[[], T], hostname: str = "") -> None:
        self._read = read
        self._hostname = hostname
        # Read ahead by prepare() for the next collect ([]: that read failed); None: not.
        self._prepared: list[T] | None = None

    def prepare(self) -> None:
        """Read now (on the loop) for the next collect, which may run on another thread."""
        try:
            self._prepared = [self._read()]
        except Exception as exc:
            self._prepared = []
            log.error(self.event, error=repr(exc))

    def describe(self) -> Iterator[Metric]:
        return iter(())  # nothing read at registration: the series come at scrape time

    def collect(self) -> Iterator[Metric]:
        prepared, self._prepared = self._prepared, None
        if prepared is not None:
            yield from (self.render(prepared[0]) if prepared else ())
            return
        try:
            value = self._read()
        except Exception as exc:
            log.error(self.event, error=repr(exc))
            return
        yield from self.render(value)

    def render(self, value: T) -> Iterator[Metric]:
        raise NotImplementedError
