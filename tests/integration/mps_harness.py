"""MPS through the whole agent: the simulated control daemon and clients
(gpuslice.testing.mps_control, mps_client) as real processes, `gpuslice mps-control`
as a real process, and what tests look at (pids, limits, the daemon's record)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from process_harness import GPUSLICE, AgentProcess, clean_env

from gpuslice.core.mps import DaemonPlan, RunningDaemon
from gpuslice.core.ports import MpsLauncher
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.mps_client import SimulatedClient

SIMULATED = [sys.executable, "-m", "gpuslice.testing.mps_control"]
GPU = "nvidia.com/gpu"
TIME_SLICING = "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n"
PID_FILE = "nvidia-cuda-mps-control.pid"


class GatedStarts:
    """A launcher whose starts wait while `gate` is clear (the rest passes through)."""

    def __init__(self, inner: MpsLauncher) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()

    async def start(self, plan: DaemonPlan) -> RunningDaemon:
        await self.gate.wait()
        return await self.inner.start(plan)

    async def running(self, root: str) -> RunningDaemon | None:
        return await self.inner.running(root)

    async def found(self, mps_root: str) -> tuple[RunningDaemon, ...]:
        return await self.inner.found(mps_root)

    async def exited(self, daemon: RunningDaemon) -> None:
        await self.inner.exited(daemon)


def mps_config(root: Path, replicas: int = 4, devices: str = "all", rename: str = "") -> str:
    return (
        f"version: v1\nflags:\n  mpsRoot: {root}\nsharing:\n  mps:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n      devices: {devices}\n"
        + (f"      rename: {rename}\n" if rename else "")
    )


def pipe_dir(root: Path, resource: str = GPU) -> Path:
    return root / resource / "pipe"


def query(pipe: Path, command: str) -> str:
    """Ask the daemon as a person would: the command on stdin of the control binary."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    done = subprocess.run(
        SIMULATED, input=f"{command}\n", env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def daemon_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / PID_FILE).read_text())
    except (OSError, ValueError):
        return None
    return pid if runs(pid) else None


def recorded_gpus(root: Path, resource: str = GPU) -> list[str]:
    """The GPUs the running daemon was started with, as recorded beside its directories."""
    record = json.loads((root / resource / "daemon.json").read_text())
    gpus: list[str] = record["gpus"]
    return gpus


def runs(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def all_healthy(
    kubelet: KubeletStandin, healthy: bool, count: int = 16, resource: str = GPU
) -> bool:
    devices = kubelet.devices(resource).values()
    return len(devices) == count and all(d.healthy == healthy for d in devices)


async def connect(root: Path, resource: str = GPU) -> SimulatedClient:
    return await SimulatedClient.connect(str(pipe_dir(root, resource)))


def kill_daemons(root: Path) -> None:
    """Test teardown: daemons outlive agents, so every one left under `root` is killed."""
    for pid_file in root.glob("*/*/pipe/" + PID_FILE):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@contextlib.asynccontextmanager
async def mps_control(root: Path, socket: str) -> AsyncIterator[AgentProcess]:
    """`gpuslice mps-control --simulated`, serving on `socket`."""
    proc = await asyncio.create_subprocess_exec(
        GPUSLICE, "mps-control", "--simulated", "--mps-root", str(root),
        "--mps-control-socket", socket,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env=clean_env(),
    )  # fmt: skip
    host = AgentProcess(proc)
    try:
        await host.wait_for_line("mps_control_serving")
        yield host
    finally:
        await host.kill()
        print(f"gpuslice mps-control (status {host.proc.returncode}):\n{host.log}")
