"""Agent memory: VmRSS of the `gpuslice run` process, idle and after N Allocates.

Idle is read IDLE_S after every device is listed at the stand-in; the Allocates (one
replica each, in turn over all 384) are sent from this process over the stand-in's
channel. Baseline: an interpreter idling with grpc.aio and the generated device-plugin
stubs imported, the least any Python device plugin holds.
"""

from __future__ import annotations

import asyncio

from bench.agent_process import REPLICAS, agent_process, interpreter, vmrss_mib
from bench.harness import MIB, Figure, Target
from bench.plan import Plan
from bench.rigs import GPU, scratch, serving
from bench.startup import STUBS
from gpuslice.adapters.kubelet.api import pb

FIGURES = ("rss_idle", "rss_after_allocates", "rss_growth")
IDLE_S = 1.0  # after the first full list, before the idle reading


async def baseline_rss() -> float:
    async with interpreter(STUBS) as (proc, _):
        await asyncio.sleep(IDLE_S)
        return vmrss_mib(proc.pid)


async def run(plan: Plan) -> list[Figure]:
    checkpoints: dict[str, float] = {}
    with scratch() as work:
        async with agent_process(work) as (proc, kubelet, _):
            await kubelet.wait_for(lambda k: serving(k, {GPU: 8 * REPLICAS}))
            await asyncio.sleep(IDLE_S)
            idle = vmrss_mib(proc.pid)
            client = kubelet.plugin_stub(GPU)
            requests = [
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[d])]
                )
                for d in sorted(kubelet.devices(GPU))
            ]
            for i in range(plan.allocates):
                await client.Allocate(requests[i % len(requests)])
                if i + 1 == plan.allocates // 10:
                    checkpoints[f"after_{i + 1}_allocates_mib"] = round(vmrss_mib(proc.pid), 2)
            after = vmrss_mib(proc.pid)
    base = await baseline_rss()
    setup = {"setup": f"gpuslice run, dgx-a100 x {REPLICAS} replicas, VmRSS of the agent process"}
    return [
        Figure(
            "rss_idle",
            "agent RSS, registered and idle",
            MIB,
            [idle],
            (Target(60.0),),
            [base],
            "python idling with grpc.aio and the device-plugin stubs imported",
            setup,
        ),
        Figure(
            "rss_after_allocates",
            f"agent RSS after {plan.allocates} Allocates",
            MIB,
            [after],
            (Target(60.0),),
            detail=setup,
        ),
        Figure(
            "rss_growth",
            f"agent RSS growth over {plan.allocates} Allocates",
            MIB,
            [after - idle],
            (Target(1.0),),
            detail={**setup, **checkpoints},
        ),
    ]
