"""DRA: NodePrepareResources latency against a no-op DRA server (whole GPUs, 1 and 8 per
claim; a share of a replicated GPU under consumable capacity; a MIG device; a partition
under --dra-dynamic-mig, its MIG instance created in the call; such a partition with MPS,
its own control daemon started in the call), how long a
health change takes to reach the ResourceSlices in the API, and how long a deleted slice
takes to be back (a starting kubelet deletes them all).

The DRA front-end runs in this process as `gpuslice run --dra` builds it (driver,
publisher, gRPC sockets, checkpoint file, CDI spec directory, lightkube client) on a
simulated dgx-a100 against the API server stand-in. Each timed prepare is a claim never
prepared before: the ResourceClaim is read over HTTP, checked, its CDI spec and the
checkpoint written (fsync'ed), and it is unprepared again, untimed, before the next. The
no-op server answers the same request message with a prebuilt response on an identical
grpc.aio server; blocks alternate between the two. The kubelet gives a plugin 45 s.
The MPS case runs the simulated nvidia-cuda-mps-control (a Python process per daemon and
per command, where the real binary is C), so it takes MPS_CALLS calls a trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from lightkube import AsyncClient, KubeConfig

from bench.harness import MS, Figure, Target, now, percentile
from bench.plan import Plan
from bench.rigs import scratch
from gpuslice.adapters.deviceplugin.api import unix_target
from gpuslice.adapters.dra.checkpoint import ClaimCheckpointFile
from gpuslice.adapters.dra.claim_specs import ClaimSpecDir
from gpuslice.adapters.dra.server import DraServer
from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.hosts.simulated import SIMULATED_MPS_CONTROL
from gpuslice.adapters.kube.dra_api import KubeDraApi
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2 as dra
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2_grpc as dra_grpc
from gpuslice.adapters.mps import ControlCommands, LocalLauncher
from gpuslice.config.options import resolve_options
from gpuslice.config.settings import load_config
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.dra.devices import DraOptions
from gpuslice.frontends.dra.claim_mps import HOLDER, ClaimDaemons
from gpuslice.frontends.dra.driver import DraDriver
from gpuslice.frontends.dra.dynamic_mig import MigInstances
from gpuslice.frontends.dra.frontend import DraFrontEnd
from gpuslice.frontends.dra.publisher import SlicePublisher
from gpuslice.services.mps import DaemonSettings, MpsDaemons, MpsTools
from gpuslice.services.node_devices import HEALTH, NodeDevices
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.kubelet.dra import DraKubeletStandin
from gpuslice.wiring.host import host, plugin_settings

CASES = {  # name: (hardware, devices per claim, what one claim is)
    "1": ("dgx-a100", 1, "a new claim of 1 GPU"),
    "8": ("dgx-a100", 8, "a new claim of 8 GPUs"),
    "shares": ("dgx-a100", 1, "a new claim of one share (consumable capacity, 4 replicas)"),
    "mig": ("a100-40gb-mig-single", 1, "a new claim of one MIG device"),
    # --dra-dynamic-mig: the GPU and compute instance created at the placement in prepare
    # (simulated MIG), destroyed by the untimed unprepare
    "dynamic_mig": (
        "a100-40gb-mig-single",
        1,
        "a new claim of one 1g partition, its instance created",
    ),
    # and a MigDeviceConfig asking for MPS: the claim's control daemon started (simulated)
    # and its limits set and read back; quit by the untimed unprepare
    "dynamic_mig_mps": (
        "a100-40gb-mig-single",
        1,
        "a new claim of one 1g partition with MPS, its instance and control daemon started",
    ),
}
MPS_CALLS = 4  # per trial and side: each prepare starts a daemon and sends it 6 commands
MPS_CONFIG = {
    "source": "FromClaim",
    "opaque": {
        "driver": "gpu.nvidia.com",
        "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
        },
    },
}
FIGURES = (
    *(f"dra_prepare_{case}_p{q}" for case in CASES for q in (50, 99)),
    "dra_publish_after_health_p99",
    "dra_slice_repair_p99",
)
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "      - {name: nvidia.com/gpu, replicas: 4}\n"
)
NODE, DRIVER = "bench-node", "gpu.nvidia.com"
KUBELET_TIMEOUT_MS = 45_000.0
BLOCK = 10
NOOP = "no-op NodePrepareResources on an identical grpc.aio server"


class _Noop(dra_grpc.DRAPluginServicer):
    def __init__(self) -> None:
        self.answer = dra.NodePrepareResourcesResponse()

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.answer


def _flags(work: str, *, shares: bool) -> dict[str, str]:
    """The agent's flags: with `shares`, a config replicating each GPU 4 times."""
    if not shares:
        return {}
    path = Path(work, "config.yaml")
    path.write_text(SHARED)
    return {"config-file": str(path)}


@contextlib.asynccontextmanager
async def dra_rig(
    work: str, hardware: str = "dgx-a100", *, shares: bool = False, dynamic: bool = False
) -> AsyncIterator[tuple[FakeApiServer, DraFrontEnd, NodeDevices, HardwareSnapshot]]:
    node = NodeDevices(lambda: FakeBackend.from_spec(hardware))
    session = contextlib.AsyncExitStack()
    running = await session.enter_async_context(node.session())
    options = resolve_options(_flags(work, shares=shares))
    settings = plugin_settings(load_config(options), options, host(options))
    running.commit(await running.read(), settings)
    count = len(node.snapshot.gpus) + sum(len(g.mig_devices) for g in node.snapshot.gpus)
    count = 10**6 if dynamic else count  # a device per placement
    async with FakeApiServer() as api:
        config = KubeConfig.from_file(write_kubeconfig(Path(work), api.url))
        client = AsyncClient(config=config, trust_env=False)
        kube = KubeDraApi(client)
        opts = DraOptions(consumable_shares=shares, dynamic_mig=dynamic)
        plugin_dir = os.path.join(work, "plugins", DRIVER)
        specs = ClaimSpecDir(os.path.join(work, "cdi"))
        checkpoint = ClaimCheckpointFile(plugin_dir)
        mig = MigInstances(node.on_backend) if dynamic else None
        binary = SIMULATED_MPS_CONTROL
        tools = MpsTools(LocalLauncher(binary), ControlCommands(binary))
        daemons = MpsDaemons(tools, DaemonSettings(claims=True, holder=HOLDER))
        mps = ClaimDaemons(daemons, node.hold, os.path.join(work, "mps"))
        driver = DraDriver(node=NODE, opts=opts, view=node, api=kube, checkpoint=checkpoint,
                           specs=specs, mig=mig, mps=mps)  # fmt: skip
        endpoint = DraServer(driver, registry_dir=os.path.join(work, "reg"), plugin_dir=plugin_dir)
        frontend = DraFrontEnd(node, driver, SlicePublisher(kube, node=NODE, opts=opts), endpoint)
        await frontend.start()
        await frontend.prepare(node.snapshot, node.settings)()
        task = asyncio.create_task(frontend.run())
        kubelet = DraKubeletStandin(os.path.join(work, "reg"), slices=api.dra, node=NODE)
        try:
            await kubelet.discover(DRIVER)  # slices are published once registered
            await api.wait_for(lambda s: 0 < len(s.dra.node_devices(NODE)) <= count)
            yield api, frontend, node, node.snapshot
        finally:
            await kubelet.close()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()
            await mps.close()
            await session.aclose()
            for pid in _daemon_pids(os.path.join(work, "mps")):  # a bench leaves none behind
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


async def prepare_figures(plan: Plan, case: str) -> list[Figure]:
    hardware, size, what = CASES[case]
    with_mps = case == "dynamic_mig_mps"
    calls = MPS_CALLS if with_mps else max(plan.calls // 10, 10)
    block = MPS_CALLS if with_mps else BLOCK
    ours: dict[int, list[float]] = {50: [], 99: []}
    base: dict[int, list[float]] = {50: [], 99: []}
    with scratch() as work:
        dynamic = case.startswith("dynamic_mig")
        async with dra_rig(work, hardware, shares=case == "shares", dynamic=dynamic) as (
            api, frontend, _, _,
        ):  # fmt: skip
            names = [n for n in sorted(frontend.driver.devices) if not dynamic or "-mig-1g" in n]
            names = names[:size]
            share = {"shareID": "s", "consumedCapacity": {"shares": "1", "memory": "4Gi"}}
            results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": n,
                        **(share if case == "shares" else {})} for n in names]  # fmt: skip
            noop_server = grpc.aio.server()
            dra_grpc.add_DRAPluginServicer_to_server(_Noop(), noop_server)
            noop_path = os.path.join(work, "noop.sock")
            noop_server.add_insecure_port(unix_target(noop_path))
            await noop_server.start()
            service = frontend.endpoint.service_path  # type: ignore[attr-defined]
            async with (
                grpc.aio.insecure_channel(unix_target(service)) as chan,
                grpc.aio.insecure_channel(unix_target(noop_path)) as noop_chan,
            ):
                agent, noop = dra_grpc.DRAPluginStub(chan), dra_grpc.DRAPluginStub(noop_chan)
                counter = iter(range(10**9))
                config = [MPS_CONFIG] if with_mps else []

                async def one(stub: Any) -> float:
                    name = f"claim-{next(counter)}"
                    claim = api.dra.put_claim("bench", name, results, config)
                    ref = dra.Claim(namespace="bench", uid=claim["metadata"]["uid"], name=name)
                    request = dra.NodePrepareResourcesRequest(claims=[ref])
                    t0 = now()
                    resp = await stub.NodePrepareResources(request)
                    took = now() - t0
                    if stub is agent:
                        if resp.claims[ref.uid].error or len(resp.claims[ref.uid].devices) != size:
                            raise RuntimeError(f"prepare failed: {resp.claims[ref.uid].error}")
                        await agent.NodeUnprepareResources(
                            dra.NodeUnprepareResourcesRequest(claims=[ref])
                        )
                    return took

                for trial in range(-1, plan.trials):  # trial -1: warm-up
                    mine: list[float] = []
                    theirs: list[float] = []
                    for _ in range(0, calls, block):
                        theirs += [await one(noop) for _ in range(block)]
                        mine += [await one(agent) for _ in range(block)]
                    if trial >= 0:
                        for q in (50, 99):
                            ours[q].append(percentile(mine, q) * 1e3)
                            base[q].append(percentile(theirs, q) * 1e3)
            await noop_server.stop(None)
    detail = {
        "calls_per_trial": calls,
        "setup": f"{hardware}, {what} per call, unprepared untimed",
        "kubelet_timeout_ms": KUBELET_TIMEOUT_MS,
    }
    # 1% of the kubelet's timeout, and within 10x the no-op server in the same run; with
    # MPS (processes started in the call) 10% of the timeout, the ratio reported only
    targets = (
        (Target(KUBELET_TIMEOUT_MS / 10),)
        if with_mps
        else (Target(KUBELET_TIMEOUT_MS / 100), Target(10.0, "ratio"))
    )
    return [
        Figure(
            f"dra_prepare_{case}_p{q}",
            f"NodePrepareResources p{q}, {what}",
            MS,
            ours[q],
            targets,
            base[q],
            f"{NOOP}, p{q}",
            detail,
        )
        for q in (50, 99)
    ]


def _daemon_pids(mps_root: str) -> list[int]:
    pids = []
    for pid_file in Path(mps_root).glob("*/*/pipe/nvidia-cuda-mps-control.pid"):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(pid_file.read_text()))
    return pids


async def publish_figure(plan: Plan) -> Figure:
    flips = max(plan.restarts, 3)
    values: list[float] = []
    with scratch() as work:
        async with dra_rig(work) as (api, frontend, node, snapshot):
            first = frontend.driver.devices
            for _ in range(plan.trials):
                samples = []
                for i in range(flips):
                    gpu = snapshot.gpus[i % 8]
                    name = next(d.name for d in first.values() if d.uuid == gpu.uuid)
                    t0 = now()
                    node.hold(frozenset({gpu.uuid}), by=HEALTH)
                    await api.wait_for(lambda s, n=name: n not in s.dra.node_devices(NODE))
                    samples.append(now() - t0)
                    node.hold(frozenset(), by=HEALTH)
                    await api.wait_for(lambda s, n=name: n in s.dra.node_devices(NODE))
                values.append(percentile(samples, 99) * 1e3)
    return Figure(
        "dra_publish_after_health_p99",
        "A GPU marked unhealthy until its device is gone from the API's slices, p99",
        MS,
        values,
        (Target(1000.0),),
        detail={"flips_per_trial": flips, "setup": "dgx-a100, one pool of one slice"},
    )


async def repair_figure(plan: Plan) -> Figure:
    """The node's slice deleted in the API (as a starting kubelet does) until the agent's
    watch has it written back."""
    rounds = max(plan.restarts, 3)
    values: list[float] = []
    with scratch() as work:
        async with dra_rig(work) as (api, _, _, _):
            for _ in range(plan.trials):
                samples = []
                for _ in range(rounds):
                    (name,) = [s["metadata"]["name"] for s in api.dra.node_slices(NODE)]
                    t0 = now()
                    api.dra.delete_slice(name)
                    await api.wait_for(lambda s, n=name: n in s.dra.slices)
                    samples.append(now() - t0)
                values.append(percentile(samples, 99) * 1e3)
    return Figure(
        "dra_slice_repair_p99",
        "The node's ResourceSlice deleted in the API until it is back, p99",
        MS,
        values,
        (Target(1000.0),),
        detail={"deletions_per_trial": rounds, "setup": "dgx-a100, one pool of one slice"},
    )


async def run(plan: Plan) -> list[Figure]:
    figures = []
    for case in CASES:
        figures += await prepare_figures(plan, case)
    return [*figures, await publish_figure(plan), await repair_figure(plan)]
