"""Accounting's sampling cost: CPU per sample and RSS growth over many samples.

The node is the simulated dgx-a100 (8 GPUs) with 64 time-slicing replicas per GPU
(512 device IDs allocatable) and 200 pods, each holding one replica and running one
process started through the events file (25 per GPU), plus the profile's own
processes on GPU 0 (in no pod). One sample is what the agent does each interval:
the backend call on a worker thread (processes, their owners, the kubelet's device
checkpoint read from a real file), PodResources List and GetAllocatableResources
over real gRPC on a unix socket (the stand-in's answers, built once, served from
this process), and the join. Baseline, paired per trial: the same sample on the same machinery with
nothing to sample (no pods, no processes), so the ratio is what the data costs
over the round trips.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, TypeVar

import grpc

from bench.agent_process import vmrss_mib
from bench.harness import MIB, MS, Figure, Target
from bench.plan import Plan
from bench.rigs import GPU, scratch
from gpuslice.adapters.deviceplugin.api import unix_target
from gpuslice.adapters.fake import FakeBackend, load_spec
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2 as pr
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2_grpc as pr_grpc
from gpuslice.adapters.podresources import PodResourcesClient
from gpuslice.core.devices import HardwareSnapshot, replica_id
from gpuslice.core.ports import GpuBackend
from gpuslice.services.sampler import Sampler, SampleSources
from gpuslice.testing.kubelet import checkpoint
from gpuslice.testing.kubelet.podresources import PodResourcesServicer

FIGURES = ("sample_cpu", "sample_rss_growth")
REPLICAS, PODS = 64, 200
T = TypeVar("T")

Admitted = dict[str, dict[str, dict[str, tuple[str, ...]]]]


def _node(work: str, snapshot: HardwareSnapshot) -> tuple[Admitted, dict[str, tuple[str, ...]]]:
    """200 pods on replicas spread over the GPUs, one process each; returns what the
    kubelet would list and its allocatable IDs."""
    ids = [replica_id(g.uuid, n) for n in range(REPLICAS) for g in snapshot.gpus]
    state = checkpoint.Checkpoint(resources={GPU})
    lines = []
    for i in range(PODS):
        pod = f"team-{i % 10}/job-{i}"
        uid = state.record(pod, [("main", GPU, (ids[i],))])
        gpu = snapshot.gpus[i % len(snapshot.gpus)].index
        proc = {"pid": 10_000 + i, "gpu": gpu, "memory_mib": 500 + i, "sm_util": i % 50}
        lines.append(json.dumps({"process": proc | {"pod_uid": uid, "container_id": "c" * 64}}))
    checkpoint.save(os.path.join(work, "checkpoint"), state)
    with open(os.path.join(work, "events.jsonl"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return state.allocations, {GPU: tuple(ids)}


@asynccontextmanager
async def _sampler(work: str, name: str, empty: bool) -> AsyncIterator[Sampler]:
    snapshot = load_spec("dgx-a100")
    if empty:
        snapshot = HardwareSnapshot(tuple(replace(g, processes=()) for g in snapshot.gpus))
    base = os.path.join(work, name)
    os.makedirs(base)
    admitted, allocatable = ({}, {}) if empty else _node(base, snapshot)
    if empty:
        checkpoint.save(os.path.join(base, "checkpoint"), checkpoint.Checkpoint())
    backend = FakeBackend(snapshot, None if empty else os.path.join(base, "events.jsonl"))
    socket = os.path.join(base, "pr.sock")
    server = grpc.aio.server()
    lister = PodResourcesServicer(lambda: admitted, lambda: allocatable)
    pr_grpc.add_PodResourcesListerServicer_to_server(await _prebuilt(lister), server)
    server.add_insecure_port(unix_target(socket))
    await server.start()
    pool = ThreadPoolExecutor(max_workers=1)
    client = PodResourcesClient(socket, os.path.join(base, "checkpoint"))

    async def on_backend(fn: Callable[[GpuBackend], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, backend)

    try:
        sampler = Sampler(SampleSources(on_backend, lambda: snapshot, client, backend))
        got = await sampler.sample_once()
        if got is None or (not empty and len(got.containers) != PODS):
            raise RuntimeError(f"sample failed: {sampler.error}")
        yield sampler
    finally:
        await client.aclose()
        await server.stop(None)
        pool.shutdown(wait=True)
        backend.close()


class _Prebuilt(pr_grpc.PodResourcesListerServicer):
    """Answers with messages built once: the kubelet's side of the cost stays out."""

    def __init__(self, listed: pr.ListPodResourcesResponse, alloc: pr.AllocatableResourcesResponse):
        self._listed, self._alloc = listed, alloc

    async def List(self, request: object, context: object) -> pr.ListPodResourcesResponse:  # noqa: N802
        return self._listed

    async def GetAllocatableResources(  # noqa: N802
        self, request: object, context: object
    ) -> pr.AllocatableResourcesResponse:
        return self._alloc


async def _prebuilt(lister: PodResourcesServicer) -> _Prebuilt:
    context: Any = None
    listed = await lister.List(pr.ListPodResourcesRequest(), context)
    alloc = await lister.GetAllocatableResources(pr.AllocatableResourcesRequest(), context)
    return _Prebuilt(listed, alloc)


async def _cpu_ms(sampler: Sampler, n: int) -> float:
    """CPU time of this process (every thread) per sample, in ms."""
    t0 = time.process_time()
    for _ in range(n):
        await sampler.sample_once()
    return (time.process_time() - t0) / n * 1e3


async def run(plan: Plan) -> list[Figure]:
    per_trial = max(plan.calls // 2, 50)
    cpu: list[float] = []
    base: list[float] = []
    with scratch() as work:
        async with (
            _sampler(work, "full", empty=False) as full,
            _sampler(work, "empty", empty=True) as empty,
        ):
            for _ in range(plan.trials):
                base.append(await _cpu_ms(empty, per_trial))
                cpu.append(await _cpu_ms(full, per_trial))
            start = vmrss_mib(os.getpid())
            for _ in range(plan.allocates):
                await full.sample_once()
            growth = vmrss_mib(os.getpid()) - start
            live = len(full.latest.containers) if full.latest else 0
    setup = {
        "setup": f"dgx-a100 x {REPLICAS} replicas, {PODS} pods with one process each; "
        "PodResources over gRPC on a unix socket, backend call on a worker thread",
    }
    return [
        Figure(
            "sample_cpu",
            f"CPU per accounting sample ({PODS} processes, {8 * REPLICAS} replicas)",
            MS,
            cpu,
            (Target(20.0),),
            base,
            "the same sample with no pods and no processes (the round trips alone)",
            setup | {"samples_per_trial": per_trial},
        ),
        Figure(
            "sample_rss_growth",
            f"RSS growth over {plan.allocates} accounting samples",
            MIB,
            [growth],
            (Target(1.0),),
            [start],
            "the bench process's RSS before those samples (ratio: growth as a fraction of it)",
            setup | {"containers_kept": live},
        ),
    ]
