"""MPS through the whole agent on simulated hardware, with the simulated control daemon
and simulated CUDA clients run as real processes: a daemon per MPS resource started and
given its limits before its replicas are Healthy, a crashed one restarted, and daemons
that outlive the agent: adopted by the next agent, given new limits without a restart,
and replaced or quit only once their clients have left."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from agent_harness import AgentLauncher, RunningAgent, one_node_options, write_file
from mps_harness import (
    GPU,
    TIME_SLICING,
    GatedStarts,
    all_healthy,
    connect,
    daemon_pid,
    mps_config,
    mps_control,
    pipe_dir,
    query,
    recorded_gpus,
    runs,
)
from process_harness import AgentProcess, run_once

from gpuslice.core.response import Mount
from gpuslice.services.mps import MpsDaemons
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.mps_client import LOST, REFUSED, SimulatedClient
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.node import build_node

POLL_S = 0.05  # how often a retiring daemon's clients are counted here


@pytest.fixture
def root(mps_root: Path) -> Path:
    return mps_root


@pytest.fixture
async def host(root: Path, plugin_dir: str) -> AsyncIterator[AgentProcess]:
    async with mps_control(root, os.path.join(plugin_dir, "mps.sock")) as process:
        yield process


def fast_polls(running: RunningAgent) -> RunningAgent:
    mps = running.devices.mps
    assert mps is not None
    mps.poll_s = POLL_S
    return running


async def start_mps(
    launcher: AgentLauncher, root: Path, text: str | None = None, *, hosted: bool = False
) -> RunningAgent:
    config = root.parent / "mps.yaml"
    config.write_text(text or mps_config(root))
    flags = {"mps-control-socket": os.path.join(launcher.plugin_dir, "mps.sock")} if hosted else {}
    return fast_polls(await launcher.start("t4x4", config=config, flags=flags))


async def stopped_under_a_client(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path
) -> tuple[int, SimulatedClient]:
    """An agent served by `gpuslice mps-control` stopped while a client is connected:
    the daemon's pid and the client."""
    first = await start_mps(launcher, root, hosted=True)
    await kubelet.wait_for(lambda k: all_healthy(k, True))
    pid = daemon_pid(pipe_dir(root))
    assert pid is not None
    client = await connect(root)
    await first.shutdown()
    return pid, client


async def reconfigure(running: RunningAgent, text: str) -> None:
    write_file(running.opts.source.file, text)
    assert await running.reload()


async def test_a_daemon_starts_with_its_limits_before_the_replicas_are_healthy(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path
) -> None:
    """t4x4, 4 replicas: one daemon for nvidia.com/gpu sees the 4 GPUs by UUID, a client
    gets a quarter of a GPU's memory and 25% of its threads; Allocate points the
    container at that daemon's directories."""
    running = await start_mps(launcher, root)
    await kubelet.wait_for(lambda k: all_healthy(k, True))
    pipe = pipe_dir(root)
    gpus = running.devices.snapshot.gpus
    assert recorded_gpus(root) == [g.uuid for g in gpus]
    client = await connect(root)
    assert client.limits["threads"] == 25.0
    assert client.limits["pinned"] == {str(i): f"{g.memory_mib // 4}M" for i, g in enumerate(gpus)}
    assert await client.leave() == 0

    (admitted,) = await kubelet.admit("mps-pod", {"main": {GPU: 1}})
    alloc, host = admitted.allocation, root / "nvidia.com" / "gpu"
    assert alloc.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert alloc.envs["CUDA_MPS_LOG_DIRECTORY"] == "/mps/nvidia.com/gpu/log"
    assert set(alloc.mounts) == {
        Mount("/mps/nvidia.com/gpu/pipe", str(host / "pipe")),
        Mount("/mps/nvidia.com/gpu/log", str(host / "log")),
        Mount("/dev/shm", str(host / "shm")),
    }
    assert (host / "shm").stat().st_mode & 0o7777 == 0o1777
    assert daemon_pid(pipe) is not None


async def test_an_agent_restart_leaves_the_daemon_and_its_clients_alone(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path, host: AgentProcess
) -> None:
    """Daemons started from `gpuslice mps-control`: the agent stops with a client
    connected, and the daemon and the client run on; the next agent adopts the same
    daemon (same pid, never quit) and serves its replicas Healthy."""
    pid, client = await stopped_under_a_client(kubelet, launcher, root)
    assert runs(pid)
    assert client.running

    second = await start_mps(launcher, root, hosted=True)
    await kubelet.wait_for(lambda k: all_healthy(k, True))
    assert second.devices.mps is not None
    assert second.devices.mps.status() == {GPU: "running"}
    assert daemon_pid(pipe_dir(root)) == pid
    assert client.running
    late = await connect(root)
    assert late.limits["server"] == client.limits["server"]  # the same server, never restarted
    assert await late.leave() == 0
    assert await client.leave() == 0


async def test_a_restarted_agent_retires_a_daemon_no_config_wants_once_its_clients_leave(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path, host: AgentProcess
) -> None:
    """An agent restarted with time-slicing finds the MPS daemon of the last config:
    quit only after its last client has left, never under it."""
    pid, client = await stopped_under_a_client(kubelet, launcher, root)

    ts = root.parent / "ts.yaml"
    ts.write_text(TIME_SLICING + f"flags: {{mpsRoot: {root}}}\n")
    flags = {  # the chart gives the agent MPS_ROOT: where daemons of past configs are
        "mps-control-socket": os.path.join(launcher.plugin_dir, "mps.sock"),
        "mps-root": str(root),
    }
    second = fast_polls(await launcher.start("t4x4", config=ts, flags=flags))
    await second.registered(kubelet)
    mps = second.devices.mps
    assert mps is not None
    await settled(mps, lambda: mps.status() == {GPU: "waiting"})
    assert mps.waiting == {}  # nothing is withheld: no config wants its replicas
    assert runs(pid)
    assert client.running
    assert await client.leave() == 0
    await settled(mps, lambda: mps.status() == {GPU: "stopped"})
    assert not runs(pid)


async def test_a_replica_change_with_clients_connected_sets_new_limits_without_a_restart(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path
) -> None:
    """4 -> 2 replicas: the daemon and its client run on; clients from now on get the
    new limits (half a GPU, 50% of its threads), the connected one keeps its own."""
    running = await start_mps(launcher, root)
    await kubelet.wait_for(lambda k: all_healthy(k, True))
    pid = daemon_pid(pipe_dir(root))
    client = await connect(root)
    assert client.limits["threads"] == 25.0

    await reconfigure(running, mps_config(root, replicas=2))
    await kubelet.wait_for(lambda k: all_healthy(k, True, count=8))
    assert daemon_pid(pipe_dir(root)) == pid
    assert client.running
    newer = await connect(root)
    memory = running.devices.snapshot.gpus[0].memory_mib
    assert newer.limits["threads"] == 50.0
    assert newer.limits["pinned"]["0"] == f"{memory // 2}M"
    assert newer.limits["server"] == client.limits["server"]
    assert float(query(pipe_dir(root), "get_default_active_thread_percentage")) == 50.0
    for one in (newer, client):
        assert await one.leave() == 0


SHARED = "nvidia.com/gpu.shared"


async def test_a_gpu_change_waits_for_the_clients_with_the_new_replicas_withheld(
    kubelet: KubeletStandin, plugin_dir: str, root: Path
) -> None:
    """nvidia.com/gpu.shared from GPUs 0-3, then from GPUs 0 and 1 only: a new daemon
    is needed (a daemon's GPUs are fixed at start). The reload returns at once, the old
    daemon serves its client on, the new replicas are Unhealthy, /readyz says why and
    the Node gets one Event; once the client leaves the old daemon is quit and one for
    GPUs 0 and 1 started, and the replicas are Healthy."""
    config = root.parent / "mps.yaml"
    config.write_text(mps_config(root, rename=SHARED))
    api = MemoryNodeApi({"node-1": {}})
    node = build_node(one_node_options(plugin_dir, config), api)
    mps = node.devices.mps
    assert mps is not None
    mps.poll_s = POLL_S
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(stop))
    pipe = pipe_dir(root, SHARED)
    try:
        await kubelet.wait_for(lambda k: all_healthy(k, True, resource=SHARED))
        old = daemon_pid(pipe)
        client = await connect(root, SHARED)

        write_file(config, mps_config(root, devices='["0", "1"]', rename=SHARED))
        assert await asyncio.wait_for(node.reload(), 5.0)  # never waits for clients
        await kubelet.wait_for(lambda k: all_healthy(k, False, count=8, resource=SHARED))
        await settled(mps, lambda: SHARED in mps.waiting)
        ready, details = node.readiness()
        assert not ready
        why = details["mps"]["waiting"][SHARED]
        assert why.startswith(f"{SHARED}: new replicas withheld until the 1 client of its MPS")
        (event,) = [e for e in api.events if e.reason == "MpsDaemonWaiting"]
        assert (event.message, event.type) == (why, "Warning")
        assert daemon_pid(pipe) == old
        assert client.running

        assert await client.leave() == 0
        await kubelet.wait_for(lambda k: all_healthy(k, True, count=8, resource=SHARED))
        assert daemon_pid(pipe) not in (None, old)
        gpus = node.devices.snapshot.gpus
        assert recorded_gpus(root, SHARED) == [gpus[0].uuid, gpus[1].uuid]
        assert node.readiness()[0]
        assert len([e for e in api.events if e.reason == "MpsDaemonWaiting"]) == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 10.0)


async def test_a_daemon_crash_with_clients_connected_is_restarted(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path, host: AgentProcess
) -> None:
    """SIGKILL of the daemon under a client: the client loses its server (a CUDA
    error), every replica goes Unhealthy until a new daemon has started with the same
    limits, the replicas come back Healthy and a new client is served."""
    running = await start_mps(launcher, root, hosted=True)
    await kubelet.wait_for(lambda k: all_healthy(k, True))
    mps = running.devices.mps
    assert mps is not None
    gated = GatedStarts(mps.launcher)
    mps.launcher = gated
    first = daemon_pid(pipe_dir(root))
    assert first is not None
    client = await connect(root)
    gated.gate.clear()  # the restart waits until the Unhealthy replicas were seen
    os.kill(first, signal.SIGKILL)
    status, error = await client.ended()
    assert (status, error) == (LOST, "CUDA error: the MPS server went away")
    await kubelet.wait_for(lambda k: all_healthy(k, False), 10.0)
    gated.gate.set()
    await kubelet.wait_for(lambda k: all_healthy(k, True), 10.0)
    assert daemon_pid(pipe_dir(root)) not in (None, first)
    again = await connect(root)
    assert again.limits["threads"] == 25.0
    assert await again.leave() == 0


async def test_a_resource_that_goes_away_is_quit_after_its_clients_and_not_with_the_agent(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path
) -> None:
    """A reload to time-slicing retires the daemon: a quitting daemon refuses nobody
    before its client leaves, then ends. Stopping the agent leaves a daemon running."""
    running = await start_mps(launcher, root)
    await kubelet.wait_for(lambda k: all_healthy(k, True))
    pid = daemon_pid(pipe_dir(root))
    assert pid is not None
    client = await connect(root)
    await reconfigure(running, TIME_SLICING)
    await kubelet.wait_for(lambda k: len(k.devices(GPU)) == 16)
    mps = running.devices.mps
    assert mps is not None
    await settled(mps, lambda: mps.status() == {GPU: "waiting"})
    extra = await connect(root)  # still served: no quit is sent while it has clients
    for one in (extra, client):
        assert await one.leave() == 0
    await settled(mps, lambda: mps.status() == {GPU: "stopped"})
    assert not runs(pid)
    with pytest.raises(RuntimeError, match=f"status {REFUSED}"):
        await connect(root)

    await reconfigure(running, mps_config(root))
    await settled(mps, lambda: mps.status() == {GPU: "running"})
    await kubelet.wait_for(lambda k: all_healthy(k, True))
    pid = daemon_pid(pipe_dir(root))
    assert pid is not None
    await running.shutdown()
    assert runs(pid)


async def test_a_daemon_that_cannot_start_keeps_its_replicas_unhealthy(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path
) -> None:
    """No control binary: the replicas are never advertised Healthy."""
    config = root.parent / "mps.yaml"
    config.write_text(mps_config(root))
    await launcher.start(
        "t4x4", config=config, flags={"mps-control-binary": str(root.parent / "none")}
    )
    await kubelet.wait_for(lambda k: all_healthy(k, False))


async def test_an_agent_started_before_mps_control_waits_for_it(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path, plugin_dir: str
) -> None:
    """--mps-control-socket names a socket nobody serves yet (its pod starts later): the
    replicas are Unhealthy and the wait is shown, without spending the restart budget;
    once `gpuslice mps-control` answers, the daemon starts and the replicas are Healthy."""
    running = await start_mps(launcher, root, hosted=True)
    await kubelet.wait_for(lambda k: all_healthy(k, False))
    mps = running.devices.mps
    await settled(mps, lambda: GPU in mps.waiting if mps else False)
    assert mps is not None
    assert "mps.sock does not answer" in mps.waiting[GPU]
    assert mps.status() in ({GPU: "waiting"}, {GPU: "starting"})
    async with mps_control(root, os.path.join(plugin_dir, "mps.sock")):
        await kubelet.wait_for(lambda k: all_healthy(k, True), 10.0)
        assert mps.waiting == {}
        assert daemon_pid(pipe_dir(root)) is not None


@pytest.mark.parametrize(
    ("hardware", "replicas", "error"),
    [
        (
            "t4",
            49,
            "nvidia.com/gpu has 49 replicas of GPU 0 (Tesla T4, compute capability "
            "7.5); MPS allows at most 48 clients per GPU",
        ),
        ("a100-40gb-mig-single", 4, "GPU 0 (GPU-"),
    ],
    ids=["over-the-client-cap", "mig-enabled"],
)
def test_invalid_mps_configs_are_refused_in_one_line_and_start_nothing(
    tmp_path: Path, hardware: str, replicas: int, error: str
) -> None:
    """`gpuslice run` exits 1 with one error line, and no daemon directory appears
    (without mpsRoot: test_cli_config)."""
    config = tmp_path / "mps.yaml"
    config.write_text(mps_config(tmp_path / "mps", replicas=replicas))
    args = ("--kubelet-socket", str(tmp_path / "kubelet.sock"), "--labels", "false")
    result = run_once("run", *args, "--fake-hardware", hardware, "--config-file", str(config))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"gpuslice: error: sharing.mps: {error}")
    assert not (tmp_path / "mps").exists()


async def test_time_slicing_starts_no_daemon(
    kubelet: KubeletStandin, launcher: AgentLauncher, root: Path
) -> None:
    """MPS management stays idle unless sharing.mps is in force."""
    config = root.parent / "ts.yaml"
    config.write_text(TIME_SLICING + f"flags: {{mpsRoot: {root}}}\n")
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    assert not await asyncio.to_thread(root.exists)


def test_mps_control_refuses_a_relative_root_in_one_line(tmp_path: Path) -> None:
    result = run_once("mps-control", "--mps-root", "run/mps")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        'gpuslice: error: --mps-root (MPS_ROOT): got "run/mps"; expected the absolute host '
        "directory of the MPS daemons, as the agent's mpsRoot (NVIDIA's Helm chart uses "
        "/run/nvidia/mps)"
    ]


async def settled(mps: MpsDaemons | None, done: Callable[[], bool]) -> None:
    """Until `done()` holds, looked at after each change of an MPS daemon."""
    assert mps is not None
    await asyncio.wait_for(mps.settled(done), 10.0)
