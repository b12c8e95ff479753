"""The Prometheus adapter as a scraper sees it: what the agent reports through the
Metrics port, the node's state and the accounting result, served on /metrics over
real HTTP and read back with prometheus-client's own parser."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from gpuslice.adapters.metrics import (
    CONTENT_TYPE,
    AccountingCollector,
    NodeSummaryCollector,
    PrometheusMetrics,
)
from gpuslice.adapters.status_http import StatusServer
from gpuslice.core.attribution import (
    Attribution,
    ContainerUsage,
    GpuUsage,
    SharedUsage,
    UnattributedUsage,
)
from gpuslice.core.metrics import (
    INVALID,
    OK,
    XID_FATAL,
    XID_IGNORED,
    GpuRef,
    GpuState,
    NodeSummary,
    ResourceState,
)

GPU = "nvidia.com/gpu"
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
UUID1 = "GPU-11111111-1111-1111-1111-111111111111"
A100 = "NVIDIA A100-SXM4-40GB"
GIB = 1024**3
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(page: bytes) -> Samples:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(page.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels` (None: there is none)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def names(samples: Samples) -> set[str]:
    return {n for n, _ in samples}


def scrape(metrics: PrometheusMetrics) -> Samples:
    kind, page = metrics.page()
    assert kind == CONTENT_TYPE
    return parse(page)


def test_what_the_services_report_becomes_counters_and_histograms() -> None:
    metrics = PrometheusMetrics(hostname="gpu-node-7")
    metrics.request_observed(GPU, "Allocate", 0.0002, OK)
    metrics.request_observed(GPU, "Allocate", 0.003, OK)
    metrics.request_observed(GPU, "Allocate", 0.0001, INVALID)
    metrics.request_observed(GPU, "GetPreferredAllocation", 0.0004, OK)
    metrics.registered(GPU)
    metrics.server_failed(GPU)
    metrics.kubelet_restart_seen()
    metrics.xid_seen(GpuRef(1, UUID1, A100), 79, XID_FATAL)
    metrics.xid_seen(GpuRef(1, UUID1, A100), 13, XID_IGNORED)
    metrics.health_transition(GpuRef(1, UUID1, A100), UUID1, "marked", "xid")
    metrics.config_applied("ts-4")
    metrics.config_rejected("ts-8")
    s = scrape(metrics)

    duration = "gpuslice_plugin_request_duration_seconds"
    allocate_ok = {"resource": GPU, "method": "Allocate", "outcome": OK}
    assert value(s, f"{duration}_count", **allocate_ok) == 2
    assert value(s, f"{duration}_sum", **allocate_ok) == 0.0032
    assert value(s, f"{duration}_bucket", **allocate_ok, le="0.00025") == 1
    assert value(s, f"{duration}_count", method="Allocate", outcome=INVALID) == 1
    assert value(s, f"{duration}_count", method="GetPreferredAllocation", outcome=OK) == 1
    assert value(s, "gpuslice_plugin_registrations_total", resource=GPU) == 1
    assert value(s, "gpuslice_plugin_server_failures_total", resource=GPU) == 1
    assert value(s, "gpuslice_kubelet_restarts_total") == 1
    gpu1 = {"gpu": "1", "UUID": UUID1, "modelName": A100, "hostname": "gpu-node-7"}
    assert value(s, "gpuslice_xid_errors_total", **gpu1, xid="79", **{"class": "fatal"}) == 1
    assert value(s, "gpuslice_xid_errors_total", xid="13", **{"class": "ignored"}) == 1
    marked = {"device": UUID1, "transition": "marked", "cause": "xid"}
    assert value(s, "gpuslice_health_transitions_total", **gpu1, **marked) == 1
    assert value(s, "gpuslice_config_applied_total", config="ts-4") == 1
    assert value(s, "gpuslice_config_rejected_total", config="ts-8") == 1
    assert value(s, "gpuslice_build_info") == 1
    assert value(s, "process_resident_memory_bytes") is not None  # the agent's own RSS
    assert not any(n.endswith("_created") for n in names(s))


def test_the_last_sample_time_appears_with_the_first_sample_only() -> None:
    """Absent, not 0, before any sample: 'time() - it' alerts only once sampling ran."""
    metrics = PrometheusMetrics(process=False)
    assert not {
        "gpuslice_last_sample_timestamp_seconds",
        "gpuslice_sample_interval_seconds",
    } & set(names(scrape(metrics)))
    metrics.sampled(1_800_000_000.5, 10.0)
    metrics.sample_failed()
    s = scrape(metrics)
    assert value(s, "gpuslice_last_sample_timestamp_seconds") == 1_800_000_000.5
    assert value(s, "gpuslice_sample_interval_seconds") == 10.0  # what the alert scales by
    assert value(s, "gpuslice_sample_failures_total") == 1


def test_node_state_is_read_at_each_scrape_and_a_failing_read_drops_only_its_series() -> None:
    states = [
        NodeSummary(
            resources=(ResourceState(GPU, advertised=16, healthy=16, registered=True),),
            gpus=(GpuState(0, UUID0, A100, 40 * GIB, healthy=True),),
            config="ts-4",
        ),
        NodeSummary(
            resources=(ResourceState(GPU, advertised=32, healthy=24, registered=False),),
            gpus=(GpuState(0, UUID0, A100, 40 * GIB, healthy=False),),
            config="ts-4",
            config_ok=False,
        ),
    ]

    def read() -> NodeSummary:
        if not states:
            raise RuntimeError("agent gone")
        return states.pop(0)

    metrics = PrometheusMetrics(hostname="n1", process=False)
    metrics.add(NodeSummaryCollector(read, hostname="n1"))
    gpu0 = {"gpu": "0", "UUID": UUID0, "modelName": A100, "hostname": "n1"}

    s = scrape(metrics)
    assert value(s, "gpuslice_devices_advertised", resource=GPU) == 16
    assert value(s, "gpuslice_devices_healthy", resource=GPU) == 16
    assert value(s, "gpuslice_plugin_registered", resource=GPU) == 1
    assert value(s, "gpuslice_gpu_healthy", **gpu0) == 1
    assert value(s, "gpuslice_gpu_memory_total_bytes", **gpu0) == 40 * GIB
    assert value(s, "gpuslice_config_info", config="ts-4") == 1
    assert value(s, "gpuslice_config_ok") == 1

    s = scrape(metrics)
    assert value(s, "gpuslice_devices_advertised", resource=GPU) == 32
    assert value(s, "gpuslice_devices_healthy", resource=GPU) == 24
    assert value(s, "gpuslice_plugin_registered", resource=GPU) == 0
    assert value(s, "gpuslice_gpu_healthy", **gpu0) == 0
    assert value(s, "gpuslice_config_ok") == 0

    s = scrape(metrics)
    assert value(s, "gpuslice_devices_advertised", resource=GPU) is None
    assert value(s, "gpuslice_build_info") == 1


def _container(pod: str, container: str, **fields: object) -> ContainerUsage:
    base: dict[str, object] = {
        "gpu_index": 0,
        "gpu_uuid": UUID0,
        "model_name": A100,
        "namespace": "ml",
        "pod": pod,
        "container": container,
        "resource": GPU,
        "device_ids": (f"{UUID0}::0",),
        "memory_used_bytes": 2 * GIB,
        "memory_peak_bytes": 3 * GIB,
        "allocated_share": 0.25,
        "used_share": 0.05,
        "utilisation": 0.4,
        "utilisation_absent": "",
        "processes": 1,
    }
    return ContainerUsage(**{**base, **fields})  # type: ignore[arg-type]


ATTRIBUTION = Attribution(
    containers=(
        _container("train-0", "main"),
        _container(
            "infer-1",
            "server",
            gpu_index=1,
            gpu_uuid=UUID1,
            allocated_share=None,  # its replica left the kubelet's list: unknown, not 0
            utilisation=None,
            utilisation_absent="mig",
        ),
    ),
    shared=(
        SharedUsage(0, UUID0, A100, "ml", "train-0", ("ml/train-0/a", "ml/train-0/b"), GIB, 1),
    ),
    unattributed=(UnattributedUsage(0, UUID0, A100, "no_pod", 512 * 1024**2, 1),),
    gpus=(
        GpuUsage(0, UUID0, A100, 40 * GIB, 6 * GIB, 0.5, "", 3),
        GpuUsage(1, UUID1, A100, 40 * GIB, 2 * GIB, None, "mig", 1),
    ),
)


def test_accounting_renders_containers_gpus_and_what_no_container_can_be_credited_with() -> None:
    results: list[Attribution | None] = [None, ATTRIBUTION]
    metrics = PrometheusMetrics(hostname="n1", process=False)
    metrics.add(AccountingCollector(lambda: results.pop(0), hostname="n1"))
    assert not any(n.startswith("gpuslice_container") for n in names(scrape(metrics)))

    s = scrape(metrics)
    train = {"UUID": UUID0, "namespace": "ml", "pod": "train-0", "container": "main"}
    assert value(s, "gpuslice_container_gpu_memory_used_bytes", **train) == 2 * GIB
    assert value(s, "gpuslice_container_gpu_memory_peak_bytes", **train) == 3 * GIB
    assert value(s, "gpuslice_container_gpu_allocated_ratio", **train) == 0.25
    assert value(s, "gpuslice_container_gpu_memory_used_ratio", **train) == 0.05
    assert value(s, "gpuslice_container_gpu_utilization_ratio", **train) == 0.4
    assert value(s, "gpuslice_container_gpu_processes", **train, resource=GPU, gpu="0") == 1

    infer = {"UUID": UUID1, "pod": "infer-1", "container": "server"}
    assert value(s, "gpuslice_container_gpu_memory_used_bytes", **infer) == 2 * GIB
    assert value(s, "gpuslice_container_gpu_allocated_ratio", **infer) is None
    assert value(s, "gpuslice_container_gpu_utilization_ratio", **infer) is None
    why = {"UUID": UUID1, "reason": "mig", "hostname": "n1"}
    unsupported = "gpuslice_metric_unsupported_info"
    assert value(s, unsupported, **why, metric="gpuslice_container_gpu_utilization_ratio") == 1
    assert value(s, unsupported, **why, metric="gpuslice_gpu_utilization_ratio") == 1

    assert value(s, "gpuslice_gpu_memory_used_bytes", UUID=UUID0) == 6 * GIB
    assert value(s, "gpuslice_gpu_utilization_ratio", UUID=UUID0) == 0.5
    assert value(s, "gpuslice_gpu_utilization_ratio", UUID=UUID1) is None
    no_pod = {"UUID": UUID0, "reason": "no_pod"}
    assert value(s, "gpuslice_gpu_unattributed_memory_bytes", **no_pod) == 512 * 1024**2
    both = {"pod": "train-0", "containers": "ml/train-0/a,ml/train-0/b"}
    assert value(s, "gpuslice_pod_gpu_shared_memory_bytes", **both) == GIB


async def test_metrics_are_served_on_the_status_port_with_the_text_content_type() -> None:
    metrics = PrometheusMetrics(process=False)
    metrics.config_applied("ts-4")
    async with StatusServer("127.0.0.1:0", lambda: (True, {}), metrics.page) as server:
        head, body = await _get(server.port, "/metrics?format=text")
        assert head["status"] == "200"
        assert head["content-type"] == CONTENT_TYPE
        assert value(parse(body), "gpuslice_config_applied_total", config="ts-4") == 1
        head, _ = await _get(server.port, "/nothing")
        assert head["status"] == "404"


async def _get(port: int, path: str) -> tuple[Mapping[str, str], bytes]:
    """A GET as Prometheus sends it (several headers), read to the server's close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: Prometheus/2.42.0\r\n"
            "Accept: text/plain;version=0.0.4;q=0.9,*/*;q=0.1\r\n"
            "Accept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 1\r\n\r\n".encode()
        )
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
    assert int(headers["content-length"]) == len(body)
    return {"status": status.split()[1], **headers}, body
