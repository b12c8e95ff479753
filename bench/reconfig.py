"""Live reconfiguration: the node label flips, the stand-in gets the new list.

The node as `gpuslice run` wires it (wiring.build_node: the agent plus the per-node
config manager) with the in-memory Node API, a config directory holding `four` and
`eight` (time-slicing replicas), dgx-a100 and the kubelet stand-in. Each flip sets
nvidia.com/device-plugin.config to the other entry and waits until the stand-in holds
the other device count. Baseline: the same config manager (built by the same wiring)
whose apply only records that it was called: what following the label takes
(including its debounce window) before the agent is asked to change anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable

from bench.harness import MS, Figure, Target, now, percentile
from bench.plan import Plan
from bench.rigs import GPU, Rig, scratch, time_slicing, until_ready
from gpuslice.config.options import RunOptions, resolve_options
from gpuslice.config.settings import Settings
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.host import host
from gpuslice.wiring.node import build_node, node_config

FIGURES = ("config_change_p99",)
NODE = "bench-node"
CONFIGS = {"four": 4, "eight": 8}


def options(plugin_dir: str, config_dir: str) -> RunOptions:
    values = {
        "kubelet-socket": os.path.join(plugin_dir, "kubelet.sock"),
        "config-file": config_dir,
        "node-name": NODE,
        "labels": "false",
    }
    return resolve_options(values, fake_hardware="dgx-a100")


@contextlib.asynccontextmanager
async def node_rig(plugin_dir: str, config_dir: str, api: MemoryNodeApi) -> AsyncIterator[Rig]:
    node = build_node(options(plugin_dir, config_dir), api)
    stop = asyncio.Event()
    async with KubeletStandin(plugin_dir) as kubelet:
        task = asyncio.create_task(node.run(stop))
        try:
            await until_ready(node.agent, task)
            rig = Rig(node, kubelet, plugin_dir, "")
            await rig.settled()
            yield rig
        finally:
            stop.set()
            await task


@contextlib.asynccontextmanager
async def bare_manager(
    plugin_dir: str, config_dir: str, api: MemoryNodeApi, applied: Callable[[], None]
) -> AsyncIterator[None]:
    async def apply(settings: Settings) -> None:
        applied()

    opts = options(plugin_dir, config_dir)
    manager = node_config(opts, host(opts), api)[0](apply)
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        await manager.ready.wait()
        yield
    finally:
        stop.set()
        await task


def listing_of(count: int) -> Callable[[KubeletStandin], bool]:
    """A stand-in predicate: the GPU resource lists `count` devices."""
    return lambda kubelet: len(kubelet.devices(GPU)) == count


def flip(api: MemoryNodeApi, value: str) -> None:
    api.set_labels(NODE, {DEFAULT_LABEL: value})


async def run(plan: Plan) -> list[Figure]:
    values: list[float] = []
    base: list[float] = []
    with scratch() as work:
        config_dir = os.path.join(work, "configs")
        os.mkdir(config_dir)
        for name, replicas in CONFIGS.items():
            time_slicing(os.path.join(config_dir, name), replicas)
        agent_api = MemoryNodeApi({NODE: {DEFAULT_LABEL: "four"}})
        bare_api = MemoryNodeApi({NODE: {DEFAULT_LABEL: "four"}})
        calls: asyncio.Queue[float] = asyncio.Queue()
        plugins, spare = os.path.join(work, "p"), os.path.join(work, "s")
        os.mkdir(spare)
        async with (
            node_rig(plugins, config_dir, agent_api) as rig,
            bare_manager(spare, config_dir, bare_api, lambda: calls.put_nowait(now())),
        ):
            while not calls.empty():  # the first config, applied at start
                calls.get_nowait()
            gpus = len(rig.node.devices.snapshot.gpus)
            current = "four"
            for _ in range(plan.trials):
                ours: list[float] = []
                ref: list[float] = []
                for _ in range(plan.flips):
                    current = "eight" if current == "four" else "four"
                    want = gpus * CONFIGS[current]
                    t0 = now()
                    flip(agent_api, current)
                    await rig.kubelet.wait_for(listing_of(want))
                    ours.append(now() - t0)
                    t0 = now()
                    flip(bare_api, current)
                    ref.append(await asyncio.wait_for(calls.get(), 5) - t0)
                values.append(percentile(ours, 99) * 1e3)
                base.append(percentile(ref, 99) * 1e3)
    return [
        Figure(
            "config_change_p99",
            "node label flipped -> the other config's list at the stand-in, p99",
            MS,
            values,
            (Target(500.0),),
            base,
            "the same config manager with an apply that only records the call, p99",
            {
                "samples_per_trial": plan.flips,
                "setup": "dgx-a100, config directory entries four/eight (time-slicing replicas)",
            },
        )
    ]
