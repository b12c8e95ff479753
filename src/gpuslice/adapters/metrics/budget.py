"""The memory-budget watchdog's budgets, rendered at each scrape beside the accounting
series (same labels), so `used > budget` joins one to one."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuslice.adapters.metrics.labels import CONTAINER, GPU, gpu_values
from gpuslice.core.attribution import ContainerUsage

log = structlog.get_logger("gpuslice.metrics")


class BudgetCollector(Collector):
    """`read` returns (container, budget in bytes) of the latest sample."""

    def __init__(
        self, read: Callable[[], Sequence[tuple[ContainerUsage, int]]], hostname: str = ""
    ) -> None:
        self._read = read
        self._hostname = hostname

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        try:
            budgeted = list(self._read())
        except Exception as exc:  # a scrape never fails for it
            log.error("metrics_budget_failed", error=repr(exc))
            return
        family = GaugeMetricFamily(
            "gpuslice_container_gpu_memory_budget_bytes",
            "The container's GPU memory budget on a time-sliced replica (its share of the "
            "GPU's memory, or the --memory-budget override).",
            labels=[*GPU, *CONTAINER],
        )
        for c, budget in budgeted:
            gpu = gpu_values(c.gpu_index, c.gpu_uuid, c.model_name, self._hostname)
            family.add_metric([*gpu, c.namespace, c.pod, c.container, c.resource], budget)
        yield family
