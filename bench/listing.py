"""ListAndWatch first list on a large node: 8 GPUs x 7 MIG devices x 64 replicas.

The time from opening the stream to the first message, on a connected channel (as
the kubelet opens it after GetDevicePluginOptions). Baseline: a NoopServer sending
the very same message, prebuilt, so the ratio is what building the list costs over
moving it.
"""

from __future__ import annotations

import os

from bench.harness import MS, Figure, Target, now
from bench.noop import NoopServer, channel, stub
from bench.plan import Plan
from bench.rigs import GPU, agent_rig, mig_node, scratch, time_slicing
from gpuslice.adapters.deviceplugin.api import pb, pb_grpc

FIGURES = ("list_first_message",)
GPUS, MIGS, REPLICAS = 8, 7, 64


async def first_list(
    client: pb_grpc.DevicePluginAsyncStub,
) -> tuple[float, pb.ListAndWatchResponse]:
    """Seconds to the first ListAndWatch message, and the message."""
    t0 = now()
    call = client.ListAndWatch(pb.Empty())
    msg = await call.read()
    elapsed = now() - t0
    call.cancel()
    if not isinstance(msg, pb.ListAndWatchResponse):
        raise RuntimeError("ListAndWatch ended before its first message")
    return elapsed, msg


async def run(plan: Plan) -> list[Figure]:
    values: list[float] = []
    base: list[float] = []
    with scratch() as work:
        node = mig_node(os.path.join(work, "node.yaml"), GPUS)
        config = time_slicing(os.path.join(work, "ts.yaml"), REPLICAS, "single")
        async with agent_rig(work, node, config) as rig, channel(rig.socket(GPU)) as chan:
            agent = stub(chan)
            await agent.GetDevicePluginOptions(pb.Empty())
            _, message = await first_list(agent)
            if len(message.devices) != GPUS * MIGS * REPLICAS:
                raise RuntimeError(f"first list has {len(message.devices)} devices")
            async with (
                NoopServer(os.path.join(work, "noop.sock"), message) as noop,
                channel(noop.socket_path) as ref_chan,
            ):
                ref = stub(ref_chan)
                await ref.GetDevicePluginOptions(pb.Empty())
                for _ in range(plan.trials * plan.lists):
                    base.append((await first_list(ref))[0] * 1e3)
                    values.append((await first_list(agent))[0] * 1e3)
    return [
        Figure(
            "list_first_message",
            "ListAndWatch opened -> first list, 8 GPUs x 7 MIG x 64 replicas (3584 devices)",
            MS,
            values,
            (Target(50.0),),
            base,
            "a no-op server sending the same list, prebuilt",
            {"setup": "node file: 8x A100-40GB, 7x 1g.5gb each; migStrategy single"},
        )
    ]
