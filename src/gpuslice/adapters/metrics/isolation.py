"""Per-pod GPU memory limits: how each GPU enforces them, and the limits in force."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpuslice.adapters.metrics.labels import GPU, gpu_values
from gpuslice.adapters.metrics.scrape import ScrapeCollector
from gpuslice.core.isolation import IsolationView


class IsolationCollector(ScrapeCollector[IsolationView]):
    event = "metrics_isolation_failed"

    def render(self, view: IsolationView) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "gpuslice_gpu_memory_isolation_info",
            "How per-pod memory limits are enforced on this GPU (mode: dmem, driver, "
            "mps-pinned, none); always 1.",
            labels=[*GPU, "mode"],
        )
        models = {}
        for g, model in view.gpus:
            models[g.uuid] = (g.index, model)
            info.add_metric([*gpu_values(g.index, g.uuid, model, self._hostname), g.mode], 1)
        limit = GaugeMetricFamily(
            "gpuslice_pod_gpu_memory_limit_bytes",
            "The pod's GPU memory limit in force on this GPU (kind: hard, soft).",
            labels=[*GPU, "pod_uid", "kind"],
        )
        for p in view.limits:
            index, model = models.get(p.gpu_uuid, (-1, ""))
            gpu = gpu_values(index, p.gpu_uuid, model, self._hostname)
            limit.add_metric([*gpu, p.pod_uid, "hard"], p.limit.hard)
            if p.limit.soft:
                limit.add_metric([*gpu, p.pod_uid, "soft"], p.limit.soft)
        yield from (info, limit)
