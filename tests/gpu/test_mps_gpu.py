"""MPS on a real GPU: the agent starts the real nvidia-cuda-mps-control for an MPS
resource, sets its limits (read back with get_default_*), serves the replicas, and
quits the daemon when it stops. Skipped without NVML or the control binary; changes no
GPU setting (compute mode is read, never set) and stops every daemon it started."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.config.options import resolve_options
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import BackendError
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring import build_node

pytestmark = pytest.mark.gpu
GPU = "nvidia.com/gpu"
BINARY = "nvidia-cuda-mps-control"
REPLICAS = 2


@pytest.fixture
def snapshot() -> HardwareSnapshot:
    try:
        backend = NvmlBackend.open()
    except BackendError as exc:
        pytest.skip(f"NVML does not load here: {exc}")
    try:
        snap = backend.snapshot()
    finally:
        backend.close()
    if shutil.which(BINARY) is None:
        pytest.skip(f"{BINARY} is not on PATH")
    if any(g.mig_enabled for g in snap.gpus):
        pytest.skip("a GPU here has MIG enabled: MPS is refused on it")
    return snap


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gsm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def standin(workdir: Path) -> AsyncIterator[KubeletStandin]:
    async with KubeletStandin(str(workdir)) as kubelet:
        yield kubelet


def ask(pipe: Path, command: str) -> str:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    done = subprocess.run(
        [BINARY], input=f"{command}\n", env=env, capture_output=True, text=True, timeout=10
    )
    return done.stdout.strip()


async def test_the_real_daemon_runs_with_its_limits_and_is_quit_on_stop(
    snapshot: HardwareSnapshot, workdir: Path, standin: KubeletStandin
) -> None:
    root = workdir / "mps"
    config = workdir / "config.yaml"
    config.write_text(
        f"version: v1\nflags: {{mpsRoot: {root}}}\nsharing:\n  mps:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {REPLICAS}\n"
    )
    opts = resolve_options(
        {"config-file": str(config), "kubelet-socket": f"{workdir}/kubelet.sock"}
    )
    agent = build_node(opts, None)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    pipe = root / "nvidia.com" / "gpu" / "pipe"
    want = REPLICAS * len(snapshot.gpus)
    try:
        await standin.wait_for(
            lambda k: (
                len(k.devices(GPU)) == want and all(d.healthy for d in k.devices(GPU).values())
            ),
            60,
        )
        threads = ask(pipe, "get_default_active_thread_percentage")
        assert float(threads) == 100 // REPLICAS
        (admitted,) = await standin.admit("p", {"c": {GPU: 1}})
        assert admitted.allocation.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    finally:
        stop.set()
        await task
    assert ask(pipe, "get_server_list") == ""  # no daemon answers any more
