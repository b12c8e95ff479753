"""Agent memory: VmRSS of the `gpuslice run` process, idle and after N Allocates.

Idle is read IDLE_S after every device is listed at the stand-in; the Allocates (one
replica each, in turn over all 384) are sent from this process over the stand-in's
channel. Baseline, paired per trial: a process serving a no-op device-plugin server
(grpc.aio and the generated stubs, Allocate answered with an empty response), read
the same way and sent the very same requests: the least any Python device plugin holds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import grpc

from bench.agent_process import REPLICAS, agent_process, interpreter, vmrss_mib
from bench.harness import MIB, Figure, Target
from bench.plan import Plan
from bench.rigs import GPU, scratch, serving
from bench.startup import STUBS
from gpuslice.adapters.deviceplugin.api import pb, pb_grpc, unix_target

FIGURES = ("rss_idle", "rss_after_allocates", "rss_growth")
IDLE_S = 1.0  # after the first full list, before the idle reading

# A no-op device-plugin server on its own event loop thread; `ready` once it serves.
_NOOP = f"""{STUBS}
import asyncio, sys, threading

class Noop(pb_grpc.DevicePluginServicer):
    async def Allocate(self, request, context):
        return pb.AllocateResponse()

async def serve(up):
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(Noop(), server)
    server.add_insecure_port({{target!r}})
    await server.start()
    up.set()
    await server.wait_for_termination()

up = threading.Event()
threading.Thread(target=lambda: asyncio.run(serve(up)), daemon=True).start()
up.wait()
"""


class _Reading:
    """RSS idle, after the calls, and at the first tenth of them."""

    def __init__(self) -> None:
        self.idle = self.after = self.tenth = 0.0


async def _send(stub: Any, pid: int, requests: Sequence[pb.AllocateRequest], n: int) -> _Reading:
    """Read RSS idle, then send `n` Allocates through `stub` (sync or async typed)."""
    reading = _Reading()
    await asyncio.sleep(IDLE_S)
    reading.idle = vmrss_mib(pid)
    for i in range(n):
        await stub.Allocate(requests[i % len(requests)])
        if i + 1 == n // 10:
            reading.tenth = vmrss_mib(pid)
    reading.after = vmrss_mib(pid)
    return reading


async def _agent(work: str, n: int) -> tuple[_Reading, list[pb.AllocateRequest]]:
    async with agent_process(work) as (proc, kubelet, _):
        await kubelet.wait_for(lambda k: serving(k, {GPU: 8 * REPLICAS}))
        requests = [
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[d])])
            for d in sorted(kubelet.devices(GPU))
        ]
        return await _send(kubelet.plugin_stub(GPU), proc.pid, requests, n), requests


async def _noop(work: str, requests: Sequence[pb.AllocateRequest], n: int) -> _Reading:
    target = unix_target(os.path.join(work, "noop.sock"))
    async with (
        interpreter(_NOOP.format(target=target)) as (proc, _),
        grpc.aio.insecure_channel(target) as channel,
    ):
        return await _send(pb_grpc.DevicePluginStub(channel), proc.pid, requests, n)


async def run(plan: Plan) -> list[Figure]:
    agent: list[_Reading] = []
    noop: list[_Reading] = []
    for _ in range(plan.rss_trials):
        with scratch() as work:
            reading, requests = await _agent(work, plan.allocates)
            agent.append(reading)
            noop.append(await _noop(work, requests, plan.allocates))
    setup = {
        "setup": f"gpuslice run, dgx-a100 x {REPLICAS} replicas, VmRSS of the agent process",
        f"after_{plan.allocates // 10}_allocates_mib": [round(r.tenth, 2) for r in agent],
    }
    noop_name = "a no-op device-plugin server process (grpc.aio, the stubs), the same calls"
    return [
        Figure(
            "rss_idle",
            "agent RSS, registered and idle",
            MIB,
            [r.idle for r in agent],
            (Target(60.0),),
            [r.idle for r in noop],
            noop_name,
            setup,
        ),
        Figure(
            "rss_after_allocates",
            f"agent RSS after {plan.allocates} Allocates",
            MIB,
            [r.after for r in agent],
            (Target(60.0),),
            [r.after for r in noop],
            noop_name,
            setup,
        ),
        Figure(
            "rss_growth",
            f"agent RSS growth over {plan.allocates} Allocates",
            MIB,
            [r.after - r.idle for r in agent],
            (Target(1.0),),
            [r.after - r.idle for r in noop],
            noop_name,
            setup,
        ),
    ]
