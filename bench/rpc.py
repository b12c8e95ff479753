"""Unary call latency: Allocate and GetPreferredAllocation against a no-op server.

The agent (in this process, wired as `gpuslice run` wires it, registered with the
kubelet stand-in) and a NoopServer listen on unix sockets in the same directory; one
client channel each, opened the same way, sent the same request messages. Each trial
alternates blocks of calls between the two, so both sides see the same machine.
"""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from bench.harness import MS, Figure, Target, now, percentile
from bench.noop import NoopServer, channel, stub
from bench.plan import Plan
from bench.rigs import GPU, agent_rig, scratch, time_slicing
from gpuslice.adapters.deviceplugin.api import pb

if TYPE_CHECKING:  # the async stub class exists only in the type stubs
    from gpuslice.adapters.deviceplugin.api import pb_grpc

    Method = Callable[[pb_grpc.DevicePluginAsyncStub, Any], Awaitable[Any]]

FIGURES = ("allocate_p50", "allocate_p99", "preferred_whole_gpus_p99", "preferred_replicas_p99")
BLOCK = 50  # calls per side before switching
NOOP = "no-op unary call on an identical grpc.aio server"

Call = Callable[[int], Awaitable[object]]
# q -> (per-trial subject quantiles, per-trial baseline quantiles), in ms
Quantiles = dict[float, tuple[list[float], list[float]]]


async def paired(subject: Call, baseline: Call, calls: int) -> tuple[list[float], list[float]]:
    """`calls` timed calls on each side (seconds), alternating in blocks."""
    ours: list[float] = []
    base: list[float] = []
    for start in range(0, calls, BLOCK):
        for side, out in ((baseline, base), (subject, ours)):
            for i in range(start, min(start + BLOCK, calls)):
                t0 = now()
                await side(i)
                out.append(now() - t0)
    return ours, base


async def measure(
    plan: Plan,
    replicas: int,
    method: Method,
    requests: Callable[[list[str]], list[Any]],
    check: Callable[[Any], None],
    quantiles: Sequence[float],
) -> tuple[int, Quantiles]:
    """Time `method` on a dgx-a100 agent (`replicas` per GPU) and on a NoopServer with the
    messages `requests(device IDs)` makes; `check` vets the agent's first answer."""
    out: Quantiles = {q: ([], []) for q in quantiles}
    with scratch() as work:
        config = time_slicing(os.path.join(work, "ts.yaml"), replicas) if replicas > 1 else None
        async with (
            agent_rig(work, "dgx-a100", config) as rig,
            NoopServer(os.path.join(work, "noop.sock")) as noop,
            channel(rig.socket(GPU)) as ours,
            channel(noop.socket_path) as base,
        ):
            ids = sorted(rig.kubelet.devices(GPU))
            msgs = requests(ids)
            agent, ref = stub(ours), stub(base)
            check(await method(agent, msgs[0]))
            await paired(
                lambda i: method(agent, msgs[i % len(msgs)]),
                lambda i: method(ref, msgs[i % len(msgs)]),
                plan.warmup,
            )
            for _ in range(plan.trials):
                timed, untimed = await paired(
                    lambda i: method(agent, msgs[i % len(msgs)]),
                    lambda i: method(ref, msgs[i % len(msgs)]),
                    plan.calls,
                )
                for q in quantiles:
                    out[q][0].append(percentile(timed, q) * 1e3)
                    out[q][1].append(percentile(untimed, q) * 1e3)
    return len(ids), out


def allocate_requests(ids: list[str]) -> list[pb.AllocateRequest]:
    """One replica per request, in turn over every device."""
    return [
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[d])])
        for d in ids
    ]


def check_allocate(resp: pb.AllocateResponse) -> None:
    if "NVIDIA_VISIBLE_DEVICES" not in resp.container_responses[0].envs:
        raise RuntimeError("Allocate answered without NVIDIA_VISIBLE_DEVICES")


def preferred_requests(ids: list[str]) -> list[pb.PreferredAllocationRequest]:
    """400 requests of sizes 1-8 in turn (size 8 first), each from a random available
    set of at least half the devices (fixed seed)."""
    rng = random.Random(len(ids))
    out = []
    for i in range(400):
        size = 8 - i % 8
        available = sorted(rng.sample(ids, rng.randint(max(size, len(ids) // 2), len(ids))))
        req = pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, allocation_size=size
        )
        out.append(pb.PreferredAllocationRequest(container_requests=[req]))
    return out


def check_preferred(resp: pb.PreferredAllocationResponse) -> None:
    if len(resp.container_responses[0].deviceIDs) != 8:
        raise RuntimeError("GetPreferredAllocation did not fill a request of 8")


async def allocate_figures(plan: Plan) -> list[Figure]:
    count, res = await measure(
        plan, 48, lambda s, r: s.Allocate(r), allocate_requests, check_allocate, (50, 99)
    )
    detail = {"calls_per_trial": plan.calls, "setup": f"dgx-a100, 48 replicas per GPU: {count}"}
    return [
        Figure(
            f"allocate_p{q}",
            f"Allocate latency p{q}, one replica per request",
            MS,
            res[q][0],
            target,
            res[q][1],
            f"{NOOP}, p{q}",
            detail,
        )
        for q, target in ((50, (Target(1.5, "ratio"),)), (99, (Target(2.0),)))
    ]


async def preferred_figure(plan: Plan, name: str, replicas: int) -> Figure:
    count, res = await measure(
        plan,
        replicas,
        lambda s, r: s.GetPreferredAllocation(r),
        preferred_requests,
        check_preferred,
        (99,),
    )
    what = "whole GPUs (NVLink)" if replicas == 1 else f"8 GPUs x {replicas} replicas"
    return Figure(
        name,
        f"GetPreferredAllocation p99, dgx-a100 {what}, sizes 1-8",
        MS,
        res[99][0],
        (Target(5.0),),
        res[99][1],
        f"{NOOP}, p99",
        {"calls_per_trial": plan.calls, "setup": f"{count} devices, random available sets"},
    )


async def run(plan: Plan) -> list[Figure]:
    return [
        *await allocate_figures(plan),
        await preferred_figure(plan, "preferred_whole_gpus_p99", 1),
        await preferred_figure(plan, "preferred_replicas_p99", 64),
    ]
