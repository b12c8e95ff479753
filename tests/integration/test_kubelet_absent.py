"""Nothing of the kubelet's is touched while no kubelet is there: `gpuslice run` with
--kubelet-socket "" (not registering), or with no kubelet.sock yet, never connects to
the PodResources socket (a listening socket here that counts connections), neither
for accounting nor for holding back devices; once a kubelet starts, it reads it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
from agent_harness import GPU, registrations, serving
from process_harness import AgentProcess

from gpuslice.testing.kubelet import KubeletStandin


class Recorder:
    """A unix socket that counts the connections made to it and says nothing."""

    def __init__(self) -> None:
        self.connects = 0
        self.connected = asyncio.Event()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connects += 1
        self.connected.set()
        await reader.read()
        writer.close()


@pytest.fixture
async def recorder(plugin_dir: str) -> AsyncIterator[tuple[Recorder, str]]:
    # Beside the device-plugin directory, which a starting kubelet clears of sockets.
    os.mkdir(os.path.join(plugin_dir, "pod-resources"))
    path = os.path.join(plugin_dir, "pod-resources", "kubelet.sock")
    recorder = Recorder()
    server = await asyncio.start_unix_server(recorder._accepted, path)
    try:
        yield recorder, path
    finally:
        server.close()


async def _agent(
    processes: list[AgentProcess], kubelet_socket: str, pr_socket: str
) -> AgentProcess:
    agent = await AgentProcess.start(
        [
            "--fake-hardware",
            "t4",
            "--kubelet-socket",
            kubelet_socket,
            "--pod-resources-socket",
            pr_socket,
            "--sample-interval",
            "100ms",
        ]
    )
    processes.append(agent)
    # Accounting's first sample, and the hold-back check before the first listing: both
    # came and went without a kubelet (each says so once).
    await agent.wait_for_line("sample_failed", 20)
    await agent.wait_for_line("pod_resources_unavailable_keeping_holds", 20)
    return agent


async def test_not_registering_never_dials_pod_resources(
    recorder: tuple[Recorder, str], processes: list[AgentProcess]
) -> None:
    counted, path = recorder
    agent = await _agent(processes, "", path)
    assert "not registering with a kubelet" in await agent.wait_for_line("sample_failed")
    assert counted.connects == 0
    assert "Traceback" not in agent.log


async def test_pod_resources_is_dialled_only_once_a_kubelet_is_there(
    recorder: tuple[Recorder, str], plugin_dir: str, processes: list[AgentProcess]
) -> None:
    counted, path = recorder
    kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
    agent = await _agent(processes, kubelet_socket, path)
    assert f"no kubelet at {kubelet_socket} yet" in await agent.wait_for_line("sample_failed")
    assert counted.connects == 0

    async with KubeletStandin(plugin_dir) as kubelet:  # the kubelet starts
        await kubelet.wait_for(lambda k: registrations(k)[GPU] >= 1 and serving(k, {GPU: 1}), 20)
        await asyncio.wait_for(counted.connected.wait(), 20)  # read at the next sample
    assert counted.connects >= 1
    assert "Traceback" not in agent.log
