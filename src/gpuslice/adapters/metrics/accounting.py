"""Per-GPU and per-container usage, rendered at each scrape from the latest
core.attribution result. What cannot be credited to one container is shown as it
is: memory of processes in no pod (or in a pod holding no device there) as
unattributed, memory that belongs to one of several containers as shared, and a
utilisation NVML does not give as absent, with gpuslice_metric_unsupported_info
saying why."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpuslice.adapters.metrics.labels import CONTAINER, GPU, gpu_values
from gpuslice.adapters.metrics.scrape import ScrapeCollector
from gpuslice.core.attribution import Attribution

CONTAINER_UTIL = "gpuslice_container_gpu_utilization_ratio"
GPU_UTIL = "gpuslice_gpu_utilization_ratio"


class AccountingCollector(ScrapeCollector[Attribution | None]):
    """`read` returns the latest result (None before the first sample: no series)."""

    event = "metrics_accounting_failed"

    def render(self, result: Attribution | None) -> Iterator[Metric]:
        if result is None:
            return
        unsupported = _family(
            "gpuslice_metric_unsupported_info",
            "A series left out for this GPU because it cannot be measured there (reason: "
            "mig, unsupported, unreadable); always 1.",
            [*GPU, "metric", "reason"],
        )
        yield from self._containers(result, unsupported)
        yield from self._gpus(result, unsupported)
        yield unsupported

    def _gpu(self, index: int, uuid: str, model: str) -> list[str]:
        return gpu_values(index, uuid, model, self._hostname)

    def _containers(self, result: Attribution, unsupported: GaugeMetricFamily) -> Iterator[Metric]:
        labels = [*GPU, *CONTAINER]
        used = _family(
            "gpuslice_container_gpu_memory_used_bytes",
            "GPU memory used by the container's processes on this GPU (or its MIG device).",
            labels,
        )
        peak = _family(
            "gpuslice_container_gpu_memory_peak_bytes",
            "The most GPU memory the container used on this GPU while it ran.",
            labels,
        )
        allocated = _family(
            "gpuslice_container_gpu_allocated_ratio",
            "The share of the GPU allocated to the container: 1/replicas per replica, a MIG "
            "device's share of the GPU's memory, 1 for a whole GPU.",
            labels,
        )
        share = _family(
            "gpuslice_container_gpu_memory_used_ratio",
            "The share of the GPU's memory the container uses.",
            labels,
        )
        util = _family(
            CONTAINER_UTIL,
            "SM utilisation of the container's processes on this GPU, 0..1; absent where "
            "NVML does not give it (see gpuslice_metric_unsupported_info).",
            labels,
        )
        processes = _family(
            "gpuslice_container_gpu_processes", "The container's processes on this GPU.", labels
        )
        reasons: set[tuple[str, ...]] = set()
        for c in result.containers:
            gpu = self._gpu(c.gpu_index, c.gpu_uuid, c.model_name)
            key = [*gpu, c.namespace, c.pod, c.container, c.resource]
            used.add_metric(key, c.memory_used_bytes)
            peak.add_metric(key, c.memory_peak_bytes)
            share.add_metric(key, c.used_share)
            processes.add_metric(key, c.processes)
            if c.allocated_share is not None:
                allocated.add_metric(key, c.allocated_share)
            if c.utilisation is not None:
                util.add_metric(key, c.utilisation)
            elif c.utilisation_absent:
                reasons.add((*gpu, CONTAINER_UTIL, c.utilisation_absent))
        for reason in sorted(reasons):
            unsupported.add_metric(list(reason), 1)
        yield from (used, peak, allocated, share, util, processes)

    def _gpus(self, result: Attribution, unsupported: GaugeMetricFamily) -> Iterator[Metric]:
        used = _family("gpuslice_gpu_memory_used_bytes", "GPU memory in use.", GPU)
        util = _family(GPU_UTIL, "GPU utilisation, 0..1.", GPU)
        for g in result.gpus:
            gpu = self._gpu(g.gpu_index, g.gpu_uuid, g.model_name)
            used.add_metric(gpu, g.memory_used_bytes)
            if g.utilisation is not None:
                util.add_metric(gpu, g.utilisation)
            elif g.utilisation_absent:
                unsupported.add_metric([*gpu, GPU_UTIL, g.utilisation_absent], 1)
        lost = _family(
            "gpuslice_gpu_unattributed_memory_bytes",
            "GPU memory of processes no container can be credited with, by reason "
            "(no_pod: a host or system process; pod_without_device: its pod holds no "
            "device there).",
            [*GPU, "reason"],
        )
        for u in result.unattributed:
            gpu = self._gpu(u.gpu_index, u.gpu_uuid, u.model_name)
            lost.add_metric([*gpu, u.reason], u.memory_used_bytes)
        shared = _family(
            "gpuslice_pod_gpu_shared_memory_bytes",
            "GPU memory of processes that belong to one of several containers of the pod, "
            "and nothing says which (containers: namespace/pod/container, comma-separated).",
            [*GPU, "namespace", "pod", "containers"],
        )
        for s in result.shared:
            gpu = self._gpu(s.gpu_index, s.gpu_uuid, s.model_name)
            names = ",".join(s.containers)
            shared.add_metric([*gpu, s.namespace, s.pod, names], s.memory_used_bytes)
        yield from (used, util, lost, shared)


def _family(name: str, doc: str, labels: list[str] | tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))
