"""A real Prometheus (Debian's `prometheus`) scrapes `gpuslice run` on the simulated
node: the target is up, and the agent's series (resources, requests, XIDs, config)
are queryable through Prometheus' HTTP API with the values the agent reported.
.ci/run installs Prometheus and sets GPUSLICE_REQUIRE_PROMETHEUS_TEST=1, so there this
fails rather than skips when it is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agent_harness import GPU, serving
from metrics_harness import Prometheus, free_port, prometheus_binary, scraped_node
from process_harness import AgentProcess

from gpuslice.testing.kubelet import KubeletStandin

REQUIRED = os.environ.get("GPUSLICE_REQUIRE_PROMETHEUS_TEST") == "1"


@pytest.fixture
def binary() -> str:
    found = prometheus_binary()
    if found is None:
        why = "no prometheus on PATH (apt-get install prometheus)"
        if REQUIRED:
            pytest.fail(f"{why}; GPUSLICE_REQUIRE_PROMETHEUS_TEST=1 needs it")
        pytest.skip(why)
    return found


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
