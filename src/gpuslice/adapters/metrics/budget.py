"""The memory-budget watchdog's budgets, rendered at each scrape beside the accounting
series (same labels), so `used > budget` joins one to one."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpuslice.adapters.metrics.labels import CONTAINER, GPU, gpu_values
from gpuslice.adapters.metrics.scrape import ScrapeCollector
from gpuslice.core.attribution import ContainerUsage


class BudgetCollector(ScrapeCollector[Sequence[tuple[ContainerUsage, int]]]):
    """`read` returns (container, budget in bytes) of the latest sample."""

    event = "metrics_budget_failed"

    def render(self, value: Sequence[tuple[ContainerUsage, int]]) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gpuslice_container_gpu_memory_budget_bytes",
            "The container's GPU memory budget on a time-sliced replica (its share of the "
            "GPU's memory, or the --memory-budget override).",
            labels=[*GPU, *CONTAINER],
        )
        for c, budget in value:
            gpu = gpu_values(c.gpu_index, c.gpu_uuid, c.model_name, self._hostname)
            family.add_metric([*gpu, c.namespace, c.pod, c.container, c.resource], budget)
        yield family
