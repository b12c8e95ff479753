"""A real Prometheus (Debian's `prometheus`) scrapes `gpuslice run` on the simulated
node: the target is up, and the agent's series (resources, requests, XIDs, config, and
per-pod accounting of pods admitted through the kubelet stand-in, whose processes start
through the events file) are queryable through Prometheus' HTTP API with the values the
agent reported.
.ci/run installs Prometheus and sets GPUSLICE_REQUIRE_PROMETHEUS_TEST=1, so there this
fails rather than skips when it is missing."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from agent_harness import GPU, serving
from metrics_harness import Prometheus, free_port, prometheus_binary, scraped_node
from process_harness import AgentProcess

from gpuslice.core.devices import physical_id
from gpuslice.testing.kubelet import KubeletStandin

ROOT = Path(__file__).resolve().parents[2]

MIB = 1024 * 1024


@pytest.fixture
def binary() -> str:
    return prometheus_binary()


def only(result: dict[frozenset[tuple[str, str]], float]) -> tuple[dict[str, str], float]:
    assert len(result) == 1, result
    ((labels, number),) = result.items()
    return dict(labels), number


async def test_prometheus_scrapes_the_agent_and_answers_queries_on_its_series(
    binary: str,
    kubelet: KubeletStandin,
    plugin_dir: str,
    processes: list[AgentProcess],
    tmp_path: Path,
) -> None:
    port = free_port()  # Prometheus starts first: its first scrape waits on discovery
    work = tmp_path / "prometheus"
    work.mkdir()
    prometheus = Prometheus(binary, f"127.0.0.1:{port}", work)
    await prometheus.start()
    try:
        async with scraped_node(plugin_dir, tmp_path, port) as node:
            processes.append(node.proc)
            await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
            await kubelet.admit("train-0", {"main": {GPU: 2}})
            node.inject({"gpu": 1, "xid": 79})
            await kubelet.wait_for(
                lambda k: sum(not d.healthy for d in k.devices(GPU).values()) == 4
            )
            await prometheus.until('up{job="gpuslice"}', lambda r: list(r.values()) == [1.0])

            # Scraped after all of the above: the XID has made 4 of 16 replicas unhealthy.
            result = await prometheus.until(
                "gpuslice_devices_healthy", lambda r: 12.0 in r.values()
            )
            target = {"instance": f"127.0.0.1:{port}", "job": "gpuslice"}
            assert only(result) == ({**target, "resource": GPU}, 12.0)
            labels, advertised = only(prometheus.query("gpuslice_devices_advertised"))
            assert advertised == 16
            count = 'gpuslice_plugin_request_duration_seconds_count{method="Allocate"}'
            allocations = prometheus.query(f"sum by (resource) ({count})")
            assert only(allocations) == ({"resource": GPU}, 1.0)
            _, fatal = only(prometheus.query('gpuslice_xid_errors_total{class="fatal",gpu="1"}'))
            assert fatal == 1
            labels, healthy = only(prometheus.query('gpuslice_gpu_healthy{gpu="1"}'))
            assert healthy == 0
            assert labels["modelName"] == "Tesla T4"
            assert labels["hostname"] == "gpu-node-7"
            _, config = only(prometheus.query('gpuslice_config_info{config="ts-4"}'))
            assert config == 1
    finally:
        await prometheus.stop()


@pytest.fixture
async def pod_kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    """The kubelet stand-in serving the PodResources API on its own socket too."""
    socket_path = os.path.join(plugin_dir, "pod-resources", "kubelet.sock")
    async with KubeletStandin(plugin_dir, socket_path) as standin:
        yield standin


async def test_prometheus_has_per_pod_series_for_processes_in_admitted_pods(
    binary: str,
    pod_kubelet: KubeletStandin,
    plugin_dir: str,
    processes: list[AgentProcess],
    tmp_path: Path,
) -> None:
    port = free_port()
    work = tmp_path / "prometheus"
    work.mkdir()
    prometheus = Prometheus(binary, f"127.0.0.1:{port}", work)
    await prometheus.start()
    assert pod_kubelet.pod_resources_socket is not None
    flags = ["--pod-resources-socket", pod_kubelet.pod_resources_socket,
             "--sample-interval", "200ms"]  # fmt: skip
    try:
        async with scraped_node(plugin_dir, tmp_path, port, flags) as node:
            processes.append(node.proc)
            await pod_kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
            (train,) = await pod_kubelet.admit("ml/train", {"main": {GPU: 1}})
            (infer,) = await pod_kubelet.admit("serving/infer", {"server": {GPU: 1}})
            node.inject(
                {"process": {"pid": 4242, "gpu": physical_id(train.device_ids[0]),
                             "memory_mib": 1200, "pod_uid": train.pod_uid}},
                {"process": {"pid": 4343, "gpu": physical_id(infer.device_ids[0]),
                             "memory_mib": 700, "pod_uid": infer.pod_uid}},
            )  # fmt: skip
            used = "gpuslice_container_gpu_memory_used_bytes"
            result = await prometheus.until(used, lambda r: len(r) == 2)
            by_pod = {dict(labels)["pod"]: (dict(labels), v) for labels, v in result.items()}
            labels, value = by_pod["train"]
            assert value == 1200 * MIB
            assert (labels["namespace"], labels["container"], labels["resource"]) == (
                "ml",
                "main",
                GPU,
            )
            assert labels["UUID"] == physical_id(train.device_ids[0])
            assert by_pod["infer"][1] == 700 * MIB
            _, share = only(prometheus.query(
                'gpuslice_container_gpu_allocated_ratio{pod="train"}'))  # fmt: skip
            assert share == 0.25
            _, budget = only(prometheus.query(
                'gpuslice_container_gpu_memory_budget_bytes{pod="train"}'))  # fmt: skip
            assert budget == 15360 * MIB // 4
            _, interval = only(prometheus.query("gpuslice_sample_interval_seconds"))
            assert interval == 0.2  # --sample-interval 200ms: what the alert scales by
            assert prometheus.query(_alert_expr("GpusliceSamplingStopped")) == {}
    finally:
        await prometheus.stop()


def _alert_expr(name: str) -> str:
    """The expression of one alert the chart ships, as Prometheus evaluates it."""
    rules = yaml.safe_load((ROOT / "deploy/helm/gpuslice/files/alerts.yaml").read_text())
    (expr,) = [r["expr"] for r in rules["groups"][0]["rules"] if r.get("alert") == name]
    return str(expr)
