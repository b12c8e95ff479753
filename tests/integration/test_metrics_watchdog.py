"""The memory-budget watchdog on `gpuslice run` (simulated t4x4, ts-4: 4 replicas of a
15360 MiB GPU, so a 3840 MiB budget each), fed by the sampler through the kubelet
stand-in's PodResources API: each policy acts as configured, records an Event on the Pod
in the Pod's namespace (through an API server granting exactly the RBAC rules) and is
counted in /metrics. Terminate ends the simulated process, whose PID is not the host's:
a real process that happens to have that PID is never signalled. Without the
PodResources socket the agent keeps serving and only sampling reports failure."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import GPU, serving
from metrics_harness import ScrapedNode, scrape, scraped_node, value
from process_harness import AgentProcess

from gpuslice.core.devices import physical_id
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.kubelet import KubeletStandin

REASON = "GPUMemoryOverBudget"


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    socket_path = os.path.join(plugin_dir, "pod-resources", "kubelet.sock")
    async with KubeletStandin(plugin_dir, socket_path) as standin:
        yield standin


def flags(kubelet: KubeletStandin, policy: str) -> list[str]:
    assert kubelet.pod_resources_socket is not None
    return [
        "--pod-resources-socket", kubelet.pod_resources_socket,
        "--sample-interval", "100ms",
        "--memory-budget-policy", policy,
    ]  # fmt: skip


def budget_events(api: FakeApiServer) -> list[dict[str, Any]]:
    return [e for e in api.events if e["reason"] == REASON]


async def over_budget(node: ScrapedNode, kubelet: KubeletStandin, pid: int) -> Any:
    (train,) = await kubelet.admit("ml/train", {"main": {GPU: 1}})
    node.inject({"process": {"pid": pid, "gpu": physical_id(train.device_ids[0]),
                             "memory_mib": 5000, "pod_uid": train.pod_uid}})  # fmt: skip
    await node.api.wait_for(lambda s: bool(budget_events(s)))
    (event,) = budget_events(node.api)
    assert event["metadata"]["namespace"] == "ml"
    assert event["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "train", "namespace": "ml",
        "uid": train.pod_uid,
    }  # fmt: skip
    assert event["type"] == "Warning"
    assert "5000 MiB" in event["message"]
    assert "budget of 3840 MiB" in event["message"]
    return train


async def test_terminate_ends_the_simulated_process_and_never_signals_the_host(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    # A real process of this host, whose PID the simulated GPU process reuses.
    bystander = await asyncio.create_subprocess_exec(sys.executable, "-c", "input()",
                                                     stdin=asyncio.subprocess.PIPE)  # fmt: skip
    used = "gpuslice_container_gpu_memory_used_bytes"
    try:
        async with scraped_node(plugin_dir, tmp_path, 0, flags(kubelet, "terminate")) as node:
            processes.append(node.proc)
            await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
            await over_budget(node, kubelet, bystander.pid)
            message = budget_events(node.api)[0]["message"]
            assert f"process {bystander.pid} killed (SIGKILL)" in message
            samples = await scrape(node.port)
            name = "gpuslice_memory_budget_actions_total"
            assert value(samples, name, policy="terminate", outcome="killed", resource=GPU) == 1
            # The simulated process left its GPU: the next samples see the pod use nothing.
            while value(samples, used, namespace="ml", pod="train") not in (None, 0):
                await asyncio.sleep(0.05)  # a few samples at --sample-interval 100ms
                samples = await scrape(node.port)
            await node.proc.wait_for_line("memory_budget_exceeded")
            assert node.api.answered(403) == []
            # The host's process was never signalled: it still runs, and ends as asked.
            assert bystander.returncode is None
            assert bystander.stdin is not None
            bystander.stdin.write(b"done\n")
            assert await asyncio.wait_for(bystander.wait(), 10) == 0
    finally:
        if bystander.returncode is None:
            bystander.kill()
            await bystander.wait()


async def test_unhealthy_holds_the_gpus_replicas_while_it_stays_over_budget(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    async with scraped_node(plugin_dir, tmp_path, 0, flags(kubelet, "unhealthy")) as node:
        processes.append(node.proc)
        await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
        train = await over_budget(node, kubelet, 4242)
        gpu = physical_id(train.device_ids[0])

        def unhealthy(k: KubeletStandin) -> set[str]:
            return {physical_id(i) for i, d in k.devices(GPU).items() if not d.healthy}

        await kubelet.wait_for(lambda k: unhealthy(k) == {gpu}, 10)
        assert sum(not d.healthy for d in kubelet.devices(GPU).values()) == 4
        node.inject({"process_exit": 4242})
        await kubelet.wait_for(lambda k: unhealthy(k) == set(), 10)
        samples = await scrape(node.port)
        name = "gpuslice_memory_budget_actions_total"
        assert value(samples, name, policy="unhealthy", outcome="held") == 1
        assert len(budget_events(node.api)) == 1


async def test_without_the_pod_resources_socket_the_agent_serves_and_sampling_fails(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    missing = ["--pod-resources-socket", str(tmp_path / "absent.sock"), "--sample-interval", "50ms"]
    async with scraped_node(plugin_dir, tmp_path, 0, missing) as node:
        processes.append(node.proc)
        await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
        await node.proc.wait_for_lines("sample_failed", 1)
        samples = await scrape(node.port)
        while (value(samples, "gpuslice_sample_failures_total") or 0) < 3:
            samples = await scrape(node.port)
        assert value(samples, "gpuslice_last_sample_timestamp_seconds") is None
        assert value(samples, "gpuslice_plugin_registered", resource=GPU) == 1
        assert node.proc.log.count("sample_failed") == 1  # logged once, not per sample
