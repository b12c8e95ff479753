"""MIG layouts by node label: nvidia.com/mig.config flips, the stand-in gets the new devices.

The node as `gpuslice run` wires it (wiring.build_node with --mig-parted-config) on a
simulated A100-40GB and H100-80GB, with the in-memory Node API and the kubelet stand-in
serving PodResources. Each flip sets nvidia.com/mig.config to the other of `a100-1g`
(7 x 1g.5gb on GPU 0) and `a100-3g` (2 x 3g.20gb) and waits until the stand-in lists the
new MIG resource: the pass reads the file and the GPUs, asks the kubelet who holds what,
destroys and creates the instances, and the agent re-serves through its live path. The
simulated driver creates and destroys instances at once (no creation latency; on a real
GPU NVML takes about a second per GPU instance destroyed, DRA driver notes). Baseline, in
the same trials on the same node: flipping nvidia.com/device-plugin.config between two
time-slicing configs (the H100's whole GPU as 2 or 4 replicas), the agent's own live path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from bench.harness import MS, Figure, Target, now, percentile
from bench.plan import Plan
from bench.rigs import GPU, scratch, time_slicing, until_ready
from gpuslice.config.options import resolve_options
from gpuslice.core.mig_reconcile import CONFIG_LABEL
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.services.node import Node
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.node import build_node

FIGURES = ("mig_layout_change_p99",)
NODE = "bench-node"
HARDWARE = "name: bench\ngpus:\n  - model: a100-40gb\n  - model: h100-80gb\n"
LAYOUTS = {"a100-1g": ("nvidia.com/mig-1g.5gb", 7), "a100-3g": ("nvidia.com/mig-3g.20gb", 2)}
MIG_PARTED = """\
version: v1
mig-configs:
  a100-1g:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  a100-3g:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
"""
REPLICAS = {"two": 2, "four": 4}


@contextlib.asynccontextmanager
async def mig_rig(work: str, api: MemoryNodeApi) -> AsyncIterator[tuple[Node, KubeletStandin]]:
    plugins, configs = os.path.join(work, "p"), _files(work)
    pod_resources = os.path.join(plugins, "pr", "kubelet.sock")
    values = {
        "kubelet-socket": os.path.join(plugins, "kubelet.sock"),
        "config-file": configs,
        "node-name": NODE,
        "labels": "false",
        "mig-parted-config": os.path.join(work, "mig.yaml"),
        "pod-resources-socket": pod_resources,
    }
    opts = resolve_options(values, fake_hardware=os.path.join(work, "node.yaml"))
    os.mkdir(plugins)
    node = build_node(opts, api)
    stop = asyncio.Event()
    async with KubeletStandin(plugins, pod_resources) as kubelet:
        task = asyncio.create_task(node.run(stop))
        try:
            await until_ready(node.agent, task)
            yield node, kubelet
        finally:
            stop.set()
            await task


def _files(work: str) -> str:
    """The configs directory, the mig-parted file and the node file; the configs' path."""
    configs = os.path.join(work, "configs")
    os.mkdir(configs)
    for name, replicas in REPLICAS.items():
        time_slicing(os.path.join(configs, name), replicas, mig_strategy="mixed")
    Path(work, "mig.yaml").write_text(MIG_PARTED, encoding="utf-8")
    Path(work, "node.yaml").write_text(HARDWARE, encoding="utf-8")
    return configs


def lists(resource: str, count: int) -> Callable[[KubeletStandin], bool]:
    return lambda kubelet: len(kubelet.devices(resource)) == count


def layout(name: str) -> Callable[[KubeletStandin], bool]:
    """The layout's resource serves all its devices, healthy, and the other one is gone."""
    (other,) = (r for n, (r, _) in LAYOUTS.items() if n != name)
    want = dict([LAYOUTS[name]])
    return lambda kubelet: kubelet.serves(want) and kubelet.endpoint(other) is None


async def run(plan: Plan) -> list[Figure]:
    values: list[float] = []
    base: list[float] = []
    with scratch() as work:
        labels = {DEFAULT_LABEL: "two", CONFIG_LABEL: "a100-1g"}
        api = MemoryNodeApi({NODE: labels})
        async with mig_rig(work, api) as (_, kubelet):
            await kubelet.wait_for(layout("a100-1g"), 30)
            for _ in range(plan.trials):
                ours: list[float] = []
                ref: list[float] = []
                for _ in range(plan.flips):
                    wanted = "a100-3g" if labels[CONFIG_LABEL] == "a100-1g" else "a100-1g"
                    labels[CONFIG_LABEL] = wanted
                    t0 = now()
                    api.set_labels(NODE, labels)
                    await kubelet.wait_for(layout(wanted), 30)
                    ours.append(now() - t0)
                    config = "four" if labels[DEFAULT_LABEL] == "two" else "two"
                    labels[DEFAULT_LABEL] = config
                    t0 = now()
                    api.set_labels(NODE, labels)
                    await kubelet.wait_for(lists(GPU, REPLICAS[config]), 30)
                    ref.append(now() - t0)
                values.append(percentile(ours, 99) * 1e3)
                base.append(percentile(ref, 99) * 1e3)
    return [
        Figure(
            "mig_layout_change_p99",
            "nvidia.com/mig.config flipped -> the new MIG devices listed at the stand-in, p99",
            MS,
            values,
            (Target(1000.0),),
            base,
            "nvidia.com/device-plugin.config flipped on the same node -> the new list, p99",
            {
                "samples_per_trial": plan.flips,
                "setup": "a100-40gb + h100-80gb simulated; GPU 0 between 7 x 1g.5gb and "
                "2 x 3g.20gb; the H100 untouched",
                "simulated_creation_latency": "0 (the simulated driver creates at once)",
            },
        )
    ]
