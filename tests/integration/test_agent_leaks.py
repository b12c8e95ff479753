"""A stopped agent leaves nothing behind: no threads, no file descriptors, no sockets.

gRPC starts a few process-wide threads the first time it is used, so one
warm-up run goes first and the measured run is compared with the state after it.
"""

from __future__ import annotations

import os

from agent_harness import (
    EXAMPLES,
    GPU,
    AgentLauncher,
    registrations,
    remove_dir,
    short_dir,
)
from faults_harness import Census, no_leaks

from gpuslice.testing.kubelet import KubeletStandin


def _streaming_after(kubelet: KubeletStandin, registered: int) -> bool:
    """The GPU resource registered `registered` times and is streaming its list."""
    return registrations(kubelet)[GPU] == registered and kubelet.updates(GPU) > 0


async def _full_cycle() -> None:
    """Everything an agent does: register, allocate, health event, kubelet
    restart, socket loss, reload, stop; in a fresh directory each time."""
    plugin_dir = short_dir("gsl-")
    launcher = AgentLauncher(plugin_dir)
    try:
        async with KubeletStandin(plugin_dir) as kubelet:
            running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
            await running.registered(kubelet)
            await kubelet.admit("pod", {"main": {GPU: 2}})
            running.inject(gpu=1, xid=79)
            await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 12)
            await kubelet.restart()
            await kubelet.wait_for(lambda k: _streaming_after(k, 2))
            os.unlink(running.socket("nvidia-gpu.sock"))
            await kubelet.wait_for(lambda k: _streaming_after(k, 3))
            assert await running.reload()
            await launcher.close()
            assert not [n for n in os.listdir(plugin_dir) if n.startswith("nvidia-")]
    finally:
        await launcher.close()
        remove_dir(plugin_dir)


async def test_a_stopped_agent_leaves_no_threads_or_fds() -> None:
    await _full_cycle()  # warm-up: gRPC's process-wide threads and pollers
    before = Census.take()
    for _ in range(2):
        await _full_cycle()
    await no_leaks(before)
