"""The node's state, read at each scrape so it is never stale: what each resource
advertises and whether it is registered, each GPU's health and memory, the config."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpuslice.adapters.metrics.labels import GPU, gpu_values
from gpuslice.adapters.metrics.scrape import ScrapeCollector
from gpuslice.core.metrics import NodeSummary


class NodeSummaryCollector(ScrapeCollector[NodeSummary]):
    event = "metrics_node_state_failed"

    def render(self, state: NodeSummary) -> Iterator[Metric]:
        yield from self._resources(state)
        yield from self._gpus(state)
        info = GaugeMetricFamily(
            "gpuslice_config_info", "The config in force; always 1.", labels=["config"]
        )
        if state.config is not None:
            info.add_metric([state.config], 1)
        yield info
        yield GaugeMetricFamily(
            "gpuslice_config_ok",
            "1 while the wanted config is the one in force; 0 while a newer one is refused "
            "(the last good one serves) or its source cannot be read.",
            value=1 if state.config_ok else 0,
        )

    def _resources(self, state: NodeSummary) -> Iterator[Metric]:
        labels = ["resource"]
        advertised = GaugeMetricFamily(
            "gpuslice_devices_advertised", "Devices advertised to the kubelet.", labels=labels
        )
        healthy = GaugeMetricFamily(
            "gpuslice_devices_healthy", "Advertised devices that are Healthy.", labels=labels
        )
        registered = GaugeMetricFamily(
            "gpuslice_plugin_registered",
            "1 while the resource is registered with the kubelet serving now.",
            labels=labels,
        )
        for res in state.resources:
            advertised.add_metric([res.name], res.advertised)
            healthy.add_metric([res.name], res.healthy)
            registered.add_metric([res.name], 1 if res.registered else 0)
        yield from (advertised, healthy, registered)

    def _gpus(self, state: NodeSummary) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            "gpuslice_gpu_healthy",
            "1 while the GPU and every MIG device on it are healthy.",
            labels=GPU,
        )
        total = GaugeMetricFamily(
            "gpuslice_gpu_memory_total_bytes",
            "The GPU's memory, as NVML reports it.",
            labels=GPU,
        )
        for gpu in state.gpus:
            labels = gpu_values(gpu.index, gpu.uuid, gpu.model_name, self._hostname)
            healthy.add_metric(labels, 1 if gpu.healthy else 0)
            total.add_metric(labels, gpu.memory_total_bytes)
        yield from (healthy, total)
