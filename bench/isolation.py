"""Per-pod GPU memory limits (--memory-isolation), against a no-op baseline in one run.

- Allocate p99 on an agent enforcing limits, with pods' cgroups appearing meanwhile, over
  the same agent without isolation: the design adds no work to Allocate itself.
- From a pod's cgroup appearing (mkdir, as the kubelet makes it) to its limit in force
  on the simulated driver; baseline: a bare inotify watcher seeing the same mkdir.
- Agent CPU per 100 pods: process CPU time from 100 pod cgroups appearing to all their
  limits in force, over the same 100 pods on an agent without isolation.
"""

from __future__ import annotations

import asyncio
import os
import time

from bench.harness import MS, Figure, Target, now, percentile
from bench.noop import DirWatcher
from bench.plan import Plan
from bench.rigs import GPU, Rig, agent_rig, scratch, time_slicing
from gpuslice.adapters.deviceplugin.api import pb
from gpuslice.adapters.fake import FakeBackend
from gpuslice.testing.cgroups import SYSTEMD, CgroupTree, r615_node

FIGURES = ("isolation_allocate_p99", "isolation_limit_latency", "isolation_cpu_per_100_pods")
REPLICAS = 100
# The bar for the reaction: it should stay well below a sandbox's creation (pause, CNI).
LATENCY_TARGET_MS = 100.0
CPU_TARGET_MS = 500.0  # per 100 pods, the agent's passes and the bench's own work together


async def _allocate_p99(rig: Rig, calls: int) -> list[float]:
    ids = list(rig.kubelet.devices(GPU))
    stub = rig.kubelet.plugin_stub(GPU)
    out = []
    for i in range(calls):
        req = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[ids[i % len(ids)]])]
        )
        t0 = now()
        await stub.Allocate(req)
        out.append((now() - t0) * 1e3)
    return out


async def _pods(rig: Rig, tree: CgroupTree, count: int, start: int) -> list[str]:
    uids = []
    for i in range(count):
        (admitted,) = await rig.kubelet.admit(f"p{start + i}", {"main": {GPU: 1}})
        uids.append(admitted.pod_uid)
    return uids


async def _limited(rig: Rig, uids: list[str]) -> dict[str, float]:
    isolation = rig.node.isolation
    assert isolation is not None
    while not all(u in isolation.in_force_at for u in uids):  # noqa: ASYNC110 - timed poll
        await asyncio.sleep(0.0002)
    return {u: isolation.in_force_at[u] for u in uids}


async def run(plan: Plan) -> list[Figure]:
    pods = 100 if plan.name == "full" else 20
    allocate, allocate_base, cpu, cpu_base = [], [], [], []
    latency_p50, watcher_p50, every = [], [], []
    with scratch() as work, scratch() as base_dir:
        root = os.path.join(work, "cgroup")
        tree = CgroupTree(root, SYSTEMD)
        config = time_slicing(os.path.join(work, "ts.yaml"), REPLICAS)
        flags = {"memory-isolation": "true", "cgroup-root": root}
        # The kubelet makes its QoS levels when it starts, long before any pod.
        node = r615_node("t4x4", os.path.join(work, "node.yaml"))
        tree.make_root(g.pci_bus_id for g in FakeBackend.from_spec(node).snapshot().gpus)
        levels = os.path.join(root, "kubepods.slice", "kubepods-burstable.slice")
        os.makedirs(levels, exist_ok=True)
        async with (
            agent_rig(work, node, config, flags=flags) as rig,
            agent_rig(base_dir, node, config) as base,
        ):
            for trial in range(plan.trials):
                uids = await _pods(rig, tree, pods, trial * pods)
                await _pods(base, tree, pods, trial * pods)
                made: dict[str, float] = {}
                watcher: list[float] = []
                async with DirWatcher(levels) as seen:
                    c0 = time.process_time()
                    for uid in uids:
                        made[uid] = time.monotonic()
                        tree.create_pod(uid)
                        name = tree.pod_dir(uid).name
                        async for event in seen:
                            if event.name == name:
                                watcher.append((time.monotonic() - made[uid]) * 1e3)
                                break
                    in_force = await _limited(rig, uids)
                    cpu.append((time.process_time() - c0) * 1e3 * 100 / pods)
                latency = [(in_force[u] - made[u]) * 1e3 for u in uids]
                every += latency
                latency_p50.append(percentile(latency, 50))
                watcher_p50.append(percentile(watcher, 50))
                c0 = time.process_time()
                for _ in uids:  # the same wall of work without a service to react
                    await asyncio.sleep(0)
                cpu_base.append((time.process_time() - c0) * 1e3 * 100 / pods)
                subject: list[float] = []
                baseline: list[float] = []
                for _ in range(plan.calls // 50):  # interleaved, so both see the same machine
                    subject += await _allocate_p99(rig, 50)
                    baseline += await _allocate_p99(base, 50)
                allocate.append(percentile(subject, 99))
                allocate_base.append(percentile(baseline, 99))
                for i, uid in enumerate(uids):  # the pods end: cgroups and devices freed
                    tree.remove_pod(uid)
                    await rig.kubelet.release(f"p{trial * pods + i}")
                    await base.kubelet.release(f"p{trial * pods + i}")
    return [
        Figure(
            "isolation_allocate_p99",
            "Allocate p99 with memory isolation on, over the same agent without it",
            MS,
            allocate,
            (Target(1.2, on="ratio"),),
            allocate_base,
            "the same agent without --memory-isolation",
            detail={"percentile": 99},
        ),
        Figure(
            "isolation_limit_latency",
            "From a pod's cgroup appearing to its memory limit in force (p50)",
            MS,
            latency_p50,
            (Target(LATENCY_TARGET_MS),),
            watcher_p50,
            "a bare inotify watcher seeing the same mkdir",
            detail={
                "p50_ms": round(percentile(every, 50), 3),
                "p99_ms": round(percentile(every, 99), 3),
                "pods": len(every),
            },
        ),
        Figure(
            "isolation_cpu_per_100_pods",
            "Process CPU per 100 pods from cgroup to limit in force (both agents in-process)",
            MS,
            cpu,
            (Target(CPU_TARGET_MS),),
            cpu_base,
            "the same loop with no pod to limit",
        ),
    ]
