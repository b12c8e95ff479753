"""The whole agent on real NVML against the kubelet stand-in (skipped without a GPU)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.config.options import resolve_options
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import BackendError
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.node import build_node

pytestmark = pytest.mark.gpu
GPU = "nvidia.com/gpu"


@pytest.fixture
def snapshot() -> Iterator[HardwareSnapshot]:
    try:
        backend = NvmlBackend.open()
    except BackendError as exc:
        pytest.skip(f"NVML does not load here: {exc}")
    try:
        yield backend.snapshot()
    finally:
        backend.close()


@pytest.fixture
def workdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="gsg-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def standin(workdir: str) -> AsyncIterator[KubeletStandin]:
    async with KubeletStandin(workdir) as kubelet:
        yield kubelet


Running = tuple[asyncio.Task[None], asyncio.Event]


async def _serve(workdir: str, config: str, kubelet: KubeletStandin, want: int) -> Running:
    cfg = Path(workdir) / "config.yaml"
    cfg.write_text(config)
    opts = resolve_options({"config-file": str(cfg), "kubelet-socket": f"{workdir}/kubelet.sock"})
    agent = build_node(opts, None)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await kubelet.wait_for(lambda k: len(k.devices(GPU)) == want, 15)
    return task, stop


async def _stop(running: Running) -> None:
    task, stop = running
    stop.set()
    await task


async def test_real_gpus_are_advertised_and_allocated_by_uuid(
    snapshot: HardwareSnapshot, workdir: str, standin: KubeletStandin
) -> None:
    """Every non-MIG GPU NVML reports is one healthy nvidia.com/gpu whose Allocate
    hands the container its real UUID."""
    whole = [g for g in snapshot.gpus if not g.mig_enabled]
    if not whole:
        pytest.skip("every GPU here has MIG enabled")
    running = await _serve(workdir, "version: v1\n", standin, len(snapshot.gpus))
    try:
        assert all(d.healthy for d in standin.devices(GPU).values())
        admitted = await standin.admit("p", {"c": {GPU: 1}})
        visible = admitted[0].allocation.envs["NVIDIA_VISIBLE_DEVICES"]
        assert visible in {g.uuid for g in snapshot.gpus}
    finally:
        await _stop(running)


async def test_time_slicing_on_a_real_gpu_collapses_replicas(
    snapshot: HardwareSnapshot, workdir: str, standin: KubeletStandin
) -> None:
    """4 replicas per GPU; two replicas of one GPU in one container are one visible device."""
    config = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    running = await _serve(workdir, config, standin, 4 * len(snapshot.gpus))
    try:
        first = snapshot.gpus[0].uuid
        [alloc] = await standin.allocate(GPU, [[f"{first}::0", f"{first}::1"]])
        assert alloc.envs["NVIDIA_VISIBLE_DEVICES"] == first
    finally:
        await _stop(running)
