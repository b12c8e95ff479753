"""`gpuslice run` as a real process in node mode: a mounted ConfigMap directory and no
cluster (the label reads as unset, so the default config applies), probed over HTTP on
the port it picked, following an edit of the ConfigMap and a broken entry."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import pytest
from agent_harness import GPU, registrations, serving
from node_harness import CONFIGS, time_slicing
from process_harness import AgentProcess, http_json, run_once

from gpuslice.testing.configmap import write_configmap_volume
from gpuslice.testing.kubelet import KubeletStandin

ADDRESS = re.compile(r"address='?(127\.0\.0\.1):(\d+)")


async def test_run_in_node_mode_without_a_cluster_serves_the_default_and_reports_readiness(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    write_configmap_volume(str(configs), CONFIGS)
    proc = await AgentProcess.start(
        [
            "--fake-hardware", "t4x4",
            "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock"),
            "--config-file-srcdir", str(configs),
            "--node-name", "gpu-node-7",
            "--default-config", "ts-4",
            "--status-address", "127.0.0.1:0",
        ]
    )  # fmt: skip
    processes.append(proc)
    match = ADDRESS.search(await proc.wait_for_line("status_serving"))
    assert match, proc.log
    port = int(match.group(2))
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)

    status, body = await http_json(port, "/readyz")
    assert status == 200, body
    assert body["ready"] is True
    assert body["device-plugin"]["resources"] == {GPU: True}
    assert body["config"] == {
        "config": "ts-4",
        "ok": True,
        "detail": "label nvidia.com/device-plugin.config unset; default config",
    }
    assert await http_json(port, "/healthz") == (200, {"ok": True})

    write_configmap_volume(str(configs), {**CONFIGS, "ts-4": time_slicing(2)})
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}), 10)
    assert registrations(kubelet) == {GPU: 1}

    write_configmap_volume(str(configs), {**CONFIGS, "ts-4": "version: v2\n"})
    await proc.wait_for_line("config_rejected_keeping_last_good")
    status, body = await http_json(port, "/readyz")
    assert status == 200  # still serving the last good config
    assert body["config"]["ok"] is False
    assert body["config"]["config"] == "ts-4"
    assert "config rejected, keeping ts-4" in body["config"]["detail"]
    assert serving(kubelet, {GPU: 8})

    proc.signal(signal.SIGTERM)
    rc, _ = await proc.wait()
    assert rc == 0, proc.log
    assert "Traceback" not in proc.log
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


def test_demo_switches_the_config_by_node_label_and_keeps_the_registration() -> None:
    result = run_once("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "in force: ts-4 (label nvidia.com/device-plugin.config unset; default config)" in out
    assert "kubectl label node demo-node nvidia.com/device-plugin.config=ts-8" in out
    assert "in force: ts-8 (label nvidia.com/device-plugin.config=ts-8)" in out
    assert "nvidia.com/gpu kept its registration (registered 1x)" in out
    assert "pods' devices all still advertised" in out
    assert "nvidia.com/gpu:  64" in out
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-SHARED" in out
    assert "nvidia.com/gpu.replicas=8   (was 4)" in out
    assert "GPU 3 stays Unhealthy: 8 replicas" in out
    assert "plugin sockets left behind: none" in out
    assert "llm-a: pod cgroup made; hard limit 10240 MiB in force" in out
    assert "refused: process 101: allocating 4000 MiB more is refused (out of memory)" in out
    assert "llm-a: 8000 MiB in use (the limit's currentUsed): stopped at its limit" in out
    assert (
        "llm-b: 10000 MiB in use (the limit's currentUsed): its neighbour, kept allocating" in out
    )
