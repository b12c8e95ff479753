"""`gpuslice run` on the simulated node, scraped over HTTP: /metrics counts what the
kubelet stand-in, the events file and the API server stand-in made it do (admissions,
a refused Allocate, XIDs of each class, a config switch by node label, a refused
config, a kubelet restart), read with prometheus-client's own parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_harness import GPU, serving
from metrics_harness import scrape, scraped_node, value
from node_harness import CONFIGS
from process_harness import AgentProcess

from gpuslice.testing.configmap import write_configmap_volume
from gpuslice.testing.kubelet import AdmissionError, KubeletStandin

DURATION = "gpuslice_plugin_request_duration_seconds"


def unhealthy(kubelet: KubeletStandin) -> int:
    return sum(1 for d in kubelet.devices(GPU).values() if not d.healthy)


async def test_metrics_count_what_the_agent_did(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    async with scraped_node(plugin_dir, tmp_path) as node:
        processes.append(node.proc)
        await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
        await node.proc.wait_for_lines("resource_registered", 1)

        s = await scrape(node.port)
        assert value(s, "gpuslice_devices_advertised", resource=GPU) == 16
        assert value(s, "gpuslice_devices_healthy", resource=GPU) == 16
        assert value(s, "gpuslice_plugin_registered", resource=GPU) == 1
        assert value(s, "gpuslice_config_info", config="ts-4") == 1
        assert value(s, "gpuslice_config_applied_total", config="ts-4") == 1
        assert value(s, "gpuslice_gpu_healthy", gpu="3", modelName="Tesla T4") == 1
        assert value(s, "gpuslice_gpu_memory_total_bytes", gpu="0") == 15360 * 1024**2

        # Three containers admitted the kubelet's way; one Allocate of an unknown ID.
        await kubelet.admit("train-0", {"main": {GPU: 1}})
        await kubelet.admit("infer-1", {"server": {GPU: 2}, "sidecar": {GPU: 1}})
        with pytest.raises(AdmissionError):
            await kubelet.allocate(GPU, [["GPU-not-on-this-node::0"]])

        # XIDs: 13 (skipped by policy) on GPU 0, 94 (transient) on 2, 79 (fatal) on 1.
        node.inject({"gpu": 0, "xid": 13}, {"gpu": 2, "xid": 94}, {"gpu": 1, "xid": 79})
        await kubelet.wait_for(lambda k: unhealthy(k) == 8, 5)

        # A switch by node label (16 -> 32 devices), then a refused edit of that config.
        node.set_label("ts-8")
        await kubelet.wait_for(lambda k: len(k.devices(GPU)) == 32 and unhealthy(k) == 16, 5)
        write_configmap_volume(str(node.configs), {**CONFIGS, "ts-8": "version: v2\n"})
        await node.proc.wait_for_line("config_rejected_keeping_last_good")

        await kubelet.restart()
        await node.proc.wait_for_lines("resource_registered", 2)

        s = await scrape(node.port)

    ok = {"resource": GPU, "outcome": "ok"}
    assert value(s, f"{DURATION}_count", method="Allocate", **ok) == 3
    assert value(s, f"{DURATION}_count", method="GetPreferredAllocation", **ok) == 3
    assert value(s, f"{DURATION}_count", method="Allocate", outcome="invalid") == 1
    assert value(s, f"{DURATION}_bucket", method="Allocate", le="+Inf", **ok) == 3

    def xids(gpu: str, xid: str, xid_class: str) -> float | None:
        return value(s, "gpuslice_xid_errors_total", gpu=gpu, xid=xid, **{"class": xid_class})

    assert xids("0", "13", "ignored") == 1
    assert xids("2", "94", "transient") == 1
    assert xids("1", "79", "fatal") == 1
    marked = {"transition": "marked", "cause": "xid", "modelName": "Tesla T4"}
    assert value(s, "gpuslice_health_transitions_total", gpu="1", **marked) == 1
    assert value(s, "gpuslice_health_transitions_total", gpu="2", **marked) == 1
    assert value(s, "gpuslice_gpu_healthy", gpu="0") == 1
    assert value(s, "gpuslice_gpu_healthy", gpu="1") == 0
    assert value(s, "gpuslice_gpu_healthy", gpu="2") == 0

    assert value(s, "gpuslice_devices_advertised", resource=GPU) == 32
    assert value(s, "gpuslice_devices_healthy", resource=GPU) == 16
    assert value(s, "gpuslice_config_applied_total", config="ts-8") == 1
    assert value(s, "gpuslice_config_rejected_total", config="ts-8") == 1
    assert value(s, "gpuslice_config_info", config="ts-8") == 1  # the last good one serves
    assert value(s, "gpuslice_config_ok") == 0

    assert value(s, "gpuslice_kubelet_restarts_total") == 1
    assert value(s, "gpuslice_plugin_registrations_total", resource=GPU) == 2
    assert value(s, "gpuslice_plugin_server_failures_total", resource=GPU) is None
    assert value(s, "gpuslice_plugin_registered", resource=GPU) == 1
    assert value(s, "process_resident_memory_bytes") is not None
