"""MPS through the whole agent on simulated hardware, with the simulated control daemon
(gpuslice.testing.mps_control) run as real processes: a daemon per MPS resource started
and given its limits before the resource registers, its replicas served with the
daemon's directories, Unhealthy while a crashed daemon is restarted, and every daemon
stopped when the agent stops or the resource goes away."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_harness import GPU, AgentLauncher, RunningAgent, write_file
from process_harness import run_once

from gpuslice.core.response import Mount
from gpuslice.testing.kubelet import KubeletStandin

SIMULATED = [sys.executable, "-m", "gpuslice.testing.mps_control"]
TIME_SLICING = "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n"


def mps_config(tmp_path: Path, replicas: int = 4) -> Path:
    path = tmp_path / "mps.yaml"
    path.write_text(
        f"version: v1\nflags:\n  mpsRoot: {tmp_path / 'mps'}\nsharing:\n  mps:\n"
        f"    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )
    return path


def pipe_dir(tmp_path: Path) -> Path:
    return tmp_path / "mps" / "nvidia.com" / "gpu" / "pipe"


def query(pipe: Path, command: str) -> str:
    """Ask the daemon as a client would: the command on stdin of the control binary."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    done = subprocess.run(
        SIMULATED, input=f"{command}\n", env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def daemon_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if runs(pid) else None


def runs(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def all_healthy(kubelet: KubeletStandin, healthy: bool) -> bool:
    devices = kubelet.devices(GPU).values()
    return len(devices) == 16 and all(d.healthy == healthy for d in devices)


async def start_mps(launcher: AgentLauncher, tmp_path: Path, **kw: object) -> RunningAgent:
    return await launcher.start("t4x4", config=mps_config(tmp_path), **kw)  # type: ignore[arg-type]


async def test_a_daemon_starts_with_its_limits_before_the_replicas_register(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """t4x4, 4 replicas: one daemon for nvidia.com/gpu sees the 4 GPUs by UUID, each
    client limited to a quarter of a GPU's memory and 25% of its threads (read back
    with get_default_*); Allocate points the container at that daemon's directories."""
    running = await start_mps(launcher, tmp_path)
    pipe = pipe_dir(tmp_path)
    assert daemon_pid(pipe) is not None  # already up when the agent is ready
    await running.registered(kubelet)
    gpus = running.devices.snapshot.gpus
    state = json.loads((pipe / "state.json").read_text())
    assert state["visible"] == ",".join(g.uuid for g in gpus)
    for ordinal, gpu in enumerate(gpus):
        got = query(pipe, f"get_default_device_pinned_mem_limit {ordinal}")
        assert got == f"{gpu.memory_mib // 4}M"
    assert float(query(pipe, "get_default_active_thread_percentage")) == 25.0

    (admitted,) = await kubelet.admit("mps-pod", {"main": {GPU: 1}})
    alloc, host = admitted.allocation, tmp_path / "mps" / "nvidia.com" / "gpu"
    assert alloc.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert alloc.envs["CUDA_MPS_LOG_DIRECTORY"] == "/mps/nvidia.com/gpu/log"
    assert set(alloc.mounts) == {
        Mount("/mps/nvidia.com/gpu/pipe", str(host / "pipe")),
        Mount("/mps/nvidia.com/gpu/log", str(host / "log")),
        Mount("/dev/shm", str(host / "shm")),
    }
    assert (host / "shm").stat().st_mode & 0o7777 == 0o1777


async def test_a_crashed_daemon_holds_its_replicas_unhealthy_until_restarted(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """SIGKILL of the daemon: every replica goes Unhealthy, a new daemon starts with the
    same limits, and the replicas come back Healthy."""
    running = await start_mps(launcher, tmp_path)
    await running.registered(kubelet)
    pipe = pipe_dir(tmp_path)
    first = daemon_pid(pipe)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    # Down for at least the restart backoff and a daemon start: long enough to be seen.
    await kubelet.wait_for(lambda k: all_healthy(k, False), 10.0)
    await kubelet.wait_for(lambda k: all_healthy(k, True), 10.0)
    second = daemon_pid(pipe)
    assert second not in (None, first)
    assert float(query(pipe, "get_default_active_thread_percentage")) == 25.0


async def test_every_daemon_is_stopped_with_the_agent_and_with_its_resource(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """A reload to time-slicing quits the daemon; so does stopping the agent."""
    config = mps_config(tmp_path)
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    pipe = pipe_dir(tmp_path)
    assert daemon_pid(pipe) is not None
    write_file(config, TIME_SLICING)
    assert await running.reload()
    assert daemon_pid(pipe) is None
    write_file(config, mps_config(tmp_path).read_text())
    assert await running.reload()
    pid = daemon_pid(pipe)
    assert pid is not None
    await running.shutdown()
    assert daemon_pid(pipe) is None
    assert not runs(pid)


async def test_a_daemon_that_cannot_start_keeps_its_replicas_unhealthy(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """No control binary: the replicas are never advertised Healthy."""
    running = await start_mps(
        launcher, tmp_path, flags={"mps-control-binary": str(tmp_path / "none")}
    )
    await kubelet.wait_for(lambda k: all_healthy(k, False))
    assert running.plugin.manager.handlers[GPU].unhealthy_count() == 16


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
    config = mps_config(tmp_path, replicas=replicas)
    args = ("--kubelet-socket", str(tmp_path / "kubelet.sock"), "--labels", "false")
    result = run_once("run", *args, "--fake-hardware", hardware, "--config-file", str(config))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"gpuslice: error: sharing.mps: {error}")
    assert not (tmp_path / "mps").exists()


async def test_time_slicing_starts_no_daemon(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """MPS management stays idle unless sharing.mps is in force."""
    config = tmp_path / "ts.yaml"
    config.write_text(TIME_SLICING + f"flags: {{mpsRoot: {tmp_path / 'mps'}}}\n")
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    assert not (tmp_path / "mps").exists()
