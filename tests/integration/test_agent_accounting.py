"""Accounting on the whole agent: pods admitted through the stand-in (its PodResources
API over a real unix socket), processes started, grown and ended through the events
file, sampled on the agent's backend worker and joined per container."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import AsyncIterator

import pytest
from agent_harness import EXAMPLES, GPU, AgentLauncher, RunningAgent

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.podresources import PodResourcesClient
from gpuslice.core.attribution import NO_POD, ContainerUsage
from gpuslice.core.devices import physical_id
from gpuslice.services.sampler import Sampler, SampleSources
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.agent import Parts

MIB = 1024 * 1024


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    pod_resources = os.path.join(plugin_dir, "pr", "kubelet.sock")
    async with KubeletStandin(plugin_dir, pod_resources) as standin:
        yield standin


@pytest.fixture
async def pods(kubelet: KubeletStandin) -> AsyncIterator[PodResourcesClient]:
    assert kubelet.pod_resources_socket is not None
    client = PodResourcesClient(kubelet.pod_resources_socket, kubelet.checkpoint_path)
    yield client
    await client.aclose()


class Node:
    """The agent on a simulated t4x4 (4 replicas per GPU) and a sampler beside it."""

    def __init__(self, running: RunningAgent, backend: FakeBackend, pods: PodResourcesClient):
        self.running = running
        devices = running.devices
        self.sampler = Sampler(
            SampleSources(devices.on_backend, lambda: devices.snapshot, pods, backend)
        )

    def process(self, **fields: object) -> None:
        self.line({"process": fields})

    def line(self, data: object) -> None:
        with open(self.running.events_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(data) + "\n")

    async def usage(self) -> dict[tuple[str, str], ContainerUsage]:
        got = await self.sampler.sample_once()
        assert got is not None, self.sampler.error
        return {(c.pod, c.container): c for c in got.containers}


@pytest.fixture
async def node(kubelet: KubeletStandin, launcher: AgentLauncher, pods: PodResourcesClient) -> Node:
    opened: list[FakeBackend] = []

    def keep(deps: Parts) -> Parts:
        def open_backend() -> FakeBackend:
            backend = deps.open_backend()
            assert isinstance(backend, FakeBackend)
            opened.append(backend)
            return backend

        return dataclasses.replace(deps, open_backend=open_backend)

    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml", change=keep)
    await running.registered(kubelet)
    return Node(running, opened[0], pods)


async def test_a_pods_process_is_attributed_to_its_container_while_it_runs(
    kubelet: KubeletStandin, node: Node
) -> None:
    (train,) = await kubelet.admit("ml/train", {"worker": {GPU: 1}})
    gpu = node.running.devices.snapshot.gpu_by_uuid(physical_id(train.device_ids[0]))
    assert gpu is not None
    node.process(pid=4242, gpu=gpu.index, memory_mib=1200, sm_util=40, pod_uid=train.pod_uid)
    worker = (await node.usage())[("train", "worker")]
    assert (worker.namespace, worker.resource, worker.gpu_uuid) == ("ml", GPU, gpu.uuid)
    assert (worker.memory_used_bytes, worker.allocated_share, worker.utilisation) == (
        1200 * MIB,
        0.25,
        0.4,
    )
    node.process(pid=4242, gpu=gpu.index, memory_mib=6000, pod_uid=train.pod_uid)
    assert (await node.usage())[("train", "worker")].memory_used_bytes == 6000 * MIB
    node.line({"process_exit": 4242})
    worker = (await node.usage())[("train", "worker")]
    assert (worker.memory_used_bytes, worker.memory_peak_bytes) == (0, 6000 * MIB)
    await kubelet.release("ml/train")
    got = await node.sampler.sample_once()
    assert got is not None
    assert got.containers == ()
    assert node.sampler.last_success is not None
    assert node.sampler.samples == 4


async def test_processes_of_no_pod_are_unattributed_on_their_gpu(
    kubelet: KubeletStandin, node: Node
) -> None:
    await kubelet.admit("notebook", {"main": {GPU: 1}})
    node.process(pid=77, gpu=3, memory_mib=512)
    got = await node.sampler.sample_once()
    assert got is not None
    loose = {(u.gpu_index, u.reason): u.memory_used_bytes for u in got.unattributed}
    assert loose[(3, NO_POD)] == 512 * MIB


async def test_a_kubelet_that_stops_answering_keeps_the_last_attribution(
    kubelet: KubeletStandin, node: Node
) -> None:
    await kubelet.admit("notebook", {"main": {GPU: 1}})
    first = await node.sampler.sample_once()
    at = node.sampler.last_success
    await kubelet.stop()
    assert await node.sampler.sample_once() is None
    assert node.sampler.error is not None
    assert "PodResources" in node.sampler.error
    assert (node.sampler.latest, node.sampler.last_success) == (first, at)
