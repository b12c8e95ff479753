"""The demo's memory-isolation part: two pods time-slicing one simulated A100, each
limited by the (simulated) driver to its replica's share; one is stopped at its limit
while its neighbour keeps allocating."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

from gpuslice.config.options import resolve_options
from gpuslice.core.isolation import LABEL, node_mode
from gpuslice.testing.cgroups import CgroupTree, r615_node
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.node import build_node

GPU = "nvidia.com/gpu"
CONFIG = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n" + (
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)
MIB = 1 << 20
WAIT_S = 10.0


async def isolation_walkthrough(work: str, out: Callable[[str], None]) -> None:
    os.makedirs(work)
    events, config = os.path.join(work, "events.jsonl"), os.path.join(work, "ts-4.yaml")
    _write(config, CONFIG)
    tree = CgroupTree(os.path.join(work, "cgroup"))  # the systemd driver's layout
    opts = resolve_options(
        {
            "kubelet-socket": os.path.join(work, "kubelet.sock"),
            "config-file": config,
            "node-name": "demo-node",
            "memory-isolation": "true",
            "cgroup-root": str(tree.root),
        },
        fake_hardware=r615_node("a100-40gb", os.path.join(work, "node.yaml")),
        fake_events=events,
    )
    node = build_node(opts, MemoryNodeApi({"demo-node": {}}))
    isolation = node.isolation
    assert isolation is not None
    stop = asyncio.Event()
    async with KubeletStandin(work) as kubelet:
        task = asyncio.create_task(node.run(stop))
        try:
            await asyncio.wait_for(node.agent.ready.wait(), WAIT_S)
            gpu = node.devices.snapshot.gpus[0]
            tree.make_root([gpu.pci_bus_id])  # kernel 6.14+ with dmem: the kernel enforces
            await kubelet.wait_for(lambda k: len(k.devices(GPU)) == 4)
            out(
                f"\n== Memory isolation (--memory-isolation): 1x {gpu.name}, 4 replicas, driver "
                f"{node.devices.snapshot.driver_version}"
            )
            uids = {}
            for pod in ("llm-a", "llm-b"):
                (admitted,) = await kubelet.admit(pod, {"main": {GPU: 1}})
                uids[pod] = admitted.pod_uid
                started = time.monotonic()
                tree.create_pod(admitted.pod_uid)  # as the kubelet does, before the sandbox
                while admitted.pod_uid not in isolation.in_force_at:
                    isolation.nudge()
                    await asyncio.sleep(0.001)
                took = (isolation.in_force_at[admitted.pod_uid] - started) * 1000
                (limit,) = isolation.applied[admitted.pod_uid].limits.values()
                out(f"   {pod}: pod cgroup made; hard limit {limit.hard // MIB} MiB in force "
                    f"{took:.1f} ms later")  # fmt: skip
            out(f"   node label {LABEL}={node_mode(isolation.gpus)}")
            for pid, pod in ((101, "llm-a"), (102, "llm-b")):
                _line(events, {"process": {"pid": pid, "gpu": 0, "memory_mib": 8000,
                                           "pod_uid": uids[pod]}})  # fmt: skip
            out("   llm-a and llm-b each load 8000 MiB of weights")
            _line(events, {"allocate": {"pid": 101, "memory_mib": 4000}})
            _line(events, {"allocate": {"pid": 102, "memory_mib": 2000}})
            out("   llm-a asks for 4000 MiB more, llm-b for 2000 MiB more")
            refused: Any = await node.devices.on_backend(lambda b: getattr(b, "refused", ()))
            for line in refused:
                out(f"   refused: {line}")
            used = await node.devices.on_backend(isolation.usage)
            how = {"llm-a": "stopped at its limit", "llm-b": "its neighbour, kept allocating"}
            for pod, uid in uids.items():
                mib = used.get((uid, gpu.uuid), 0) // MIB
                out(f"   {pod}: {mib} MiB in use (the limit's currentUsed): {how[pod]}")
            tree.remove_pod(uids["llm-a"])
            await kubelet.release("llm-a")
            while uids["llm-a"] in isolation.applied:
                isolation.nudge()
                await asyncio.sleep(0.001)
            out("   llm-a deleted: its cgroup, and its limit with it, are gone")
        finally:
            stop.set()
            await task


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _line(path: str, event: dict[str, object]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")
