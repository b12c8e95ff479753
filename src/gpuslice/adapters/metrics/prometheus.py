"""PrometheusMetrics: the Metrics port over a registry of its own (never the global
one), with the process collector (the agent's CPU, RSS and open files)."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.registry import Collector

from gpuslice import __version__
from gpuslice.adapters.metrics.labels import gpu_values
from gpuslice.adapters.metrics.scrape import ScrapeCollector
from gpuslice.core.metrics import GpuRef

# The classic text format: every Prometheus since 2.0 reads it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Allocate answers from memory in about 100 us; a slow one is a loaded loop.
REQUEST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5)


class PrometheusMetrics:
    """Implements core.ports.Metrics; `add` registers a scrape-time collector."""

    def __init__(self, hostname: str = "", *, process: bool = True) -> None:
        self.hostname = hostname
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series
        self.registry = r = CollectorRegistry(auto_describe=True)
        if process:
            ProcessCollector(registry=r)
        info = Gauge("gpuslice_build_info", "The agent's version; 1.", ["version"], registry=r)
        info.labels(__version__).set(1)
        self._requests = Histogram(
            "gpuslice_plugin_request_duration_seconds",
            "Device-plugin requests from the kubelet, by method and outcome (ok, invalid, "
            "error), and how long each took to answer.",
            ["resource", "method", "outcome"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self._registrations = Counter(
            "gpuslice_plugin_registrations_total",
            "Register calls the kubelet accepted.",
            ["resource"],
            registry=r,
        )
        self._server_failures = Counter(
            "gpuslice_plugin_server_failures_total",
            "Device-plugin servers that could not start or went down on their own.",
            ["resource"],
            registry=r,
        )
        self._kubelet_restarts = Counter(
            "gpuslice_kubelet_restarts_total",
            "Kubelet restarts seen (kubelet.sock created again).",
            registry=r,
        )
        self._xids = Counter(
            "gpuslice_xid_errors_total",
            "XID events by code and class under the health policy (fatal, transient, ignored).",
            ["gpu", "UUID", "modelName", "hostname", "xid", "class"],
            registry=r,
        )
        self._health = Counter(
            "gpuslice_health_transitions_total",
            "Devices (a GPU or a MIG device on it) marked unhealthy, escalated to fatal, or "
            "recovered, by cause (xid, lost, wait-failed).",
            ["gpu", "UUID", "modelName", "hostname", "device", "transition", "cause"],
            registry=r,
        )
        self._applied = Counter(
            "gpuslice_config_applied_total",
            "Configs applied and served, by config name.",
            ["config"],
            registry=r,
        )
        self._rejected = Counter(
            "gpuslice_config_rejected_total",
            "Configs refused (the last good one kept serving), by config name.",
            ["config"],
            registry=r,
        )
        self._scraped: list[ScrapeCollector[Any]] = []
        self._sampled: Gauge | None = None  # absent until the first sample: no false alarm
        self._sample_failures = Counter(
            "gpuslice_sample_failures_total", "Per-process samples that failed.", registry=r
        )
        self._budget_actions = Counter(
            "gpuslice_memory_budget_actions_total",
            "Containers over their GPU memory budget acted on, by policy (report, unhealthy, "
            "terminate) and outcome (reported, held, killed, gone, refused, failed).",
            ["gpu", "UUID", "modelName", "hostname", "resource", "policy", "outcome"],
            registry=r,
        )

    def add(self, collector: Collector) -> None:
        """Register a collector read at each scrape (node state, accounting)."""
        self.registry.register(collector)
        if isinstance(collector, ScrapeCollector):
            self._scraped.append(collector)

    def prepare(self) -> None:
        """Read the agent's state for the next page, on the loop that owns it; the page
        itself may then be rendered on another thread."""
        for collector in self._scraped:
            collector.prepare()

    def page(self) -> tuple[str, bytes]:
        """What /metrics answers: (content type, every series in the text format)."""
        return CONTENT_TYPE, generate_latest(self.registry)

    # core.ports.Metrics

    def request_observed(self, resource: str, method: str, seconds: float, outcome: str) -> None:
        self._requests.labels(resource, method, outcome).observe(seconds)

    def registered(self, resource: str) -> None:
        self._registrations.labels(resource).inc()

    def server_failed(self, resource: str) -> None:
        self._server_failures.labels(resource).inc()

    def kubelet_restart_seen(self) -> None:
        self._kubelet_restarts.inc()

    def xid_seen(self, gpu: GpuRef, xid: int, xid_class: str) -> None:
        self._xids.labels(*self._gpu(gpu), str(xid), xid_class).inc()

    def health_transition(self, gpu: GpuRef, device: str, transition: str, cause: str) -> None:
        self._health.labels(*self._gpu(gpu), device, transition, cause).inc()

    def config_applied(self, name: str) -> None:
        self._applied.labels(name).inc()

    def config_rejected(self, name: str) -> None:
        self._rejected.labels(name).inc()

    def sampled(self, at_unix_s: float, interval_s: float) -> None:
        if self._sampled is None:
            self._sampled = Gauge(
                "gpuslice_last_sample_timestamp_seconds",
                "Unix time of the last successful per-process sample.",
                registry=self.registry,
            )
            interval = Gauge(
                "gpuslice_sample_interval_seconds",
                "Seconds between per-process samples (--sample-interval).",
                registry=self.registry,
            )
            interval.set(interval_s)
        self._sampled.set(at_unix_s)

    def sample_failed(self) -> None:
        self._sample_failures.inc()

    def budget_action(self, gpu: GpuRef, resource: str, policy: str, outcome: str) -> None:
        self._budget_actions.labels(*self._gpu(gpu), resource, policy, outcome).inc()

    def _gpu(self, gpu: GpuRef) -> list[str]:
        return gpu_values(gpu.index, gpu.uuid, gpu.model_name, self.hostname)
