"""The ConfigMap edited -> the new device list at the kubelet stand-in.

Two nodes as `gpuslice run` wires them (wiring.build_node), dgx-a100, each with its own
kubelet stand-in, in one process. Subject: `--config-map`, the ConfigMap read and watched
through the API server stand-in over real HTTP (KubeNodeApi). Baseline: the mounted
directory (`--config-file-srcdir`), the same edit written as the kubelet writes it (new
payload, `..data` swapped), seen by inotify. Each sample rewrites the entry in force
between 4 and 8 time-slicing replicas and waits until the stand-in lists 32 or 64
devices; the two sides alternate. The baseline starts at the kubelet's swap, so it leaves
out the kubelet's own sync delay (about a minute) that a mounted ConfigMap adds first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path

from lightkube import AsyncClient, KubeConfig

from bench.harness import MS, Figure, Target, now, percentile
from bench.plan import Plan
from bench.reconfig import listing_of
from bench.rigs import scratch, until_ready
from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.config.options import resolve_options
from gpuslice.core.ports import NodeApi
from gpuslice.services.config_source import DEFAULT_ANNOTATION
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.configmap import write_configmap_volume
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.node import build_node

FIGURES = ("configmap_edit_p50", "configmap_edit_p99")
NODE = "bench-node"
NS = "gpuslice"
CM = "gpuslice-configs"
HARDWARE = "dgx-a100"
GPUS = 8
Edit = Callable[[int], Awaitable[float]]  # replicas -> seconds until the stand-in lists them


def entry(replicas: int) -> dict[str, str]:
    text = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )
    return {"ts": text}


@contextlib.asynccontextmanager
async def node_on(
    plugin_dir: str, values: dict[str, str], api: NodeApi
) -> AsyncIterator[KubeletStandin]:
    os.mkdir(plugin_dir)
    cli = {
        "kubelet-socket": os.path.join(plugin_dir, "kubelet.sock"),
        "node-name": NODE,
        "namespace": NS,
        "labels": "false",
        **values,
    }
    node = build_node(resolve_options(cli, fake_hardware=HARDWARE), api)
    stop = asyncio.Event()
    async with KubeletStandin(plugin_dir) as kubelet:
        task = asyncio.create_task(node.run(stop))
        try:
            await until_ready(node.agent, task)
            yield kubelet
        finally:
            stop.set()
            await task


async def timed(edit: Callable[[], None], kubelet: KubeletStandin, want: int) -> float:
    t0 = now()
    edit()
    await kubelet.wait_for(listing_of(want))
    return now() - t0


@contextlib.asynccontextmanager
async def two_nodes(work: str) -> AsyncIterator[tuple[Edit, Edit]]:
    """Both nodes serving `ts` with 4 replicas; yields each side's edit (replicas -> the
    stand-in listing it)."""
    configs = os.path.join(work, "configs")
    os.mkdir(configs)
    write_configmap_volume(configs, entry(4))
    async with FakeApiServer() as server:
        server.put_node(NODE)
        put(server, entry(4))
        config = KubeConfig.from_file(write_kubeconfig(Path(work), server.url))
        client = AsyncClient(config=config, trust_env=False)  # 127.0.0.1, never a proxy
        by_dir_values = {"config-file-srcdir": configs, "default-config": "ts"}
        try:
            async with (
                node_on(os.path.join(work, "a"), {"config-map": CM}, KubeNodeApi(client)) as a,
                node_on(os.path.join(work, "d"), by_dir_values, MemoryNodeApi({NODE: {}})) as d,
            ):
                await a.wait_for(listing_of(GPUS * 4))
                await d.wait_for(listing_of(GPUS * 4))

                async def by_api(replicas: int) -> float:
                    return await timed(partial(put, server, entry(replicas)), a, GPUS * replicas)

                async def by_dir(replicas: int) -> float:
                    edit = partial(write_configmap_volume, configs, entry(replicas))
                    return await timed(edit, d, GPUS * replicas)

                yield by_api, by_dir
        finally:
            await client.close()


async def run(plan: Plan) -> list[Figure]:
    p50s: list[float] = []
    p99s: list[float] = []
    base50: list[float] = []
    base99: list[float] = []
    with scratch() as work:
        async with two_nodes(work) as (by_api, by_dir):
            replicas = 4
            for _ in range(plan.trials):
                ours: list[float] = []
                ref: list[float] = []
                for _ in range(plan.flips):
                    replicas = 8 if replicas == 4 else 4
                    ours.append(await by_api(replicas))
                    ref.append(await by_dir(replicas))
                p50s.append(percentile(ours, 50) * 1e3)
                p99s.append(percentile(ours, 99) * 1e3)
                base50.append(percentile(ref, 50) * 1e3)
                base99.append(percentile(ref, 99) * 1e3)
    detail = {
        "samples_per_trial": plan.flips,
        "setup": f"{HARDWARE}, ConfigMap entry in force edited 4 <-> 8 time-slicing replicas",
    }
    baseline = (
        "the same edit through the mounted directory, from the kubelet's `..data` swap "
        "(its sync delay of about a minute left out)"
    )
    return [
        Figure(
            "configmap_edit_p50",
            "ConfigMap edited through the API -> new device list at the stand-in, p50",
            MS, p50s, (Target(1000.0),), base50, f"{baseline}, p50", detail,
        ),
        Figure(
            "configmap_edit_p99",
            "ConfigMap edited through the API -> new device list at the stand-in, p99",
            MS, p99s, (Target(1000.0),), base99, f"{baseline}, p99", detail,
        ),
    ]  # fmt: skip


def put(server: FakeApiServer, data: dict[str, str]) -> None:
    server.put_config_map(NS, CM, data, {DEFAULT_ANNOTATION: "ts"})
