"""MPS on a real GPU: `gpuslice mps-control` starts the real nvidia-cuda-mps-control for
the agent's MPS resource, the agent sets its limits (read back with get_default_*) and
serves the replicas; a real CUDA client (the driver API through ctypes) keeps working
while the agent stops and a new agent starts, which adopts the same daemon. Skipped
without NVML, libcuda or the control binary; changes no GPU setting (compute mode is
never set) and quits every daemon it started."""

from __future__ import annotations

import asyncio
import ctypes.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.config.options import resolve_options
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import BackendError
from gpuslice.services.node import Node
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.node import build_node

pytestmark = pytest.mark.gpu
GPU = "nvidia.com/gpu"
BINARY = "nvidia-cuda-mps-control"
REPLICAS = 2

# A CUDA client: a context on device 0 (through MPS when CUDA_MPS_PIPE_DIRECTORY names a
# daemon), then one allocation, memset and sync per stdin line, answering "ok" or the error.
CLIENT = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(what, status):
    if status != 0:
        print(f"error {what} {status}", flush=True)
        sys.exit(1)
check("cuInit", cuda.cuInit(0))
device, context = ctypes.c_int(), ctypes.c_void_p()
check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0))
check("cuCtxCreate", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
print("ok", flush=True)
for _ in sys.stdin:
    memory = ctypes.c_uint64()
    check("cuMemAlloc", cuda.cuMemAlloc_v2(ctypes.byref(memory), ctypes.c_size_t(1 << 20)))
    check("cuMemsetD8", cuda.cuMemsetD8_v2(memory, ctypes.c_ubyte(7), ctypes.c_size_t(1 << 20)))
    check("cuCtxSynchronize", cuda.cuCtxSynchronize())
    check("cuMemFree", cuda.cuMemFree_v2(memory))
    print("ok", flush=True)
"""


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
    if ctypes.util.find_library("cuda") is None:
        pytest.skip("libcuda is not here: no CUDA client can run")
    if any(g.mig_enabled for g in snap.gpus):
        pytest.skip("a GPU here has MIG enabled: MPS is refused on it")
    return snap


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gsm-", dir="/tmp"))
    try:
        yield path
    finally:
        for pid_file in path.glob("mps/*/*/pipe/nvidia-cuda-mps-control.pid"):
            ask(pid_file.parent, "quit")  # waits for clients: every one is gone by now
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def standin(workdir: Path) -> AsyncIterator[KubeletStandin]:
    async with KubeletStandin(str(workdir)) as kubelet:
        yield kubelet


@pytest.fixture
async def host(workdir: Path) -> AsyncIterator[str]:
    """`gpuslice mps-control` with the real binary, as the chart's DaemonSet runs it."""
    socket = str(workdir / "mps.sock")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuslice", "mps-control", "--mps-root", str(workdir / "mps"),
        "--mps-control-socket", socket,
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            async for line in proc.stderr:  # its log: serving once it says so
                if b"mps_control_serving" in line:
                    break
        yield socket
    finally:
        proc.terminate()
        await proc.wait()


def ask(pipe: Path, command: str) -> str:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    done = subprocess.run(
        [BINARY], input=f"{command}\n", env=env, capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip()


class Agents:
    """Agents started one after another on the same config and mps-control host."""

    def __init__(self, workdir: Path, socket: str, config: Path) -> None:
        self.opts = resolve_options(
            {
                "config-file": str(config),
                "kubelet-socket": f"{workdir}/kubelet.sock",
                "mps-control-socket": socket,
            }
        )
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Node:
        node = build_node(self.opts, None)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(node.run(self.stop))
        return node

    async def shutdown(self) -> None:
        if self.task is not None:
            self.stop.set()
            await self.task
            self.task = None


async def test_a_real_client_works_on_across_an_agent_restart(
    snapshot: HardwareSnapshot, workdir: Path, standin: KubeletStandin, host: str
) -> None:
    root = workdir / "mps"
    config = workdir / "config.yaml"
    config.write_text(
        f"version: v1\nflags: {{mpsRoot: {root}}}\nsharing:\n  mps:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {REPLICAS}\n"
    )
    pipe = root / "nvidia.com" / "gpu" / "pipe"
    want = REPLICAS * len(snapshot.gpus)

    def all_healthy(k: KubeletStandin) -> bool:
        devices = k.devices(GPU).values()
        return len(devices) == want and all(d.healthy for d in devices)

    agents = Agents(workdir, host, config)
    agents.start()
    client: asyncio.subprocess.Process | None = None
    try:
        await standin.wait_for(all_healthy, 60)
        assert float(ask(pipe, "get_default_active_thread_percentage")) == 100 // REPLICAS
        daemon = (pipe / "nvidia-cuda-mps-control.pid").read_text().strip()
        (admitted,) = await standin.admit("p", {"c": {GPU: 1}})
        assert admitted.allocation.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"

        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                 "CUDA_MPS_LOG_DIRECTORY": str(pipe.parent / "log")},
        )  # fmt: skip

        async def work() -> str:
            assert client is not None
            assert client.stdin is not None
            assert client.stdout is not None
            client.stdin.write(b"go\n")
            return (await asyncio.wait_for(client.stdout.readline(), 60)).decode().strip()

        assert client.stdout is not None
        assert (await asyncio.wait_for(client.stdout.readline(), 60)).decode().strip() == "ok"
        assert await work() == "ok"
        (server,) = ask(pipe, "get_server_list").split()
        assert str(client.pid) in ask(pipe, f"get_client_list {server}").split()

        await agents.shutdown()  # the daemon, its server and the client run on
        assert await work() == "ok"
        agents.start()
        await standin.wait_for(all_healthy, 60)
        assert (pipe / "nvidia-cuda-mps-control.pid").read_text().strip() == daemon
        assert ask(pipe, "get_server_list").split() == [server]
        assert await work() == "ok"
    finally:
        if client is not None and client.returncode is None:
            assert client.stdin is not None
            client.stdin.close()
            await asyncio.wait_for(client.wait(), 60)
        await agents.shutdown()
    assert client.returncode == 0
