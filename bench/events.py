"""Event to kubelet: an injected XID, and a kubelet restart (kubelet.sock re-created).

XID: an XID 79 line appended to the simulated backend's events file, until the stand-in
holds a list with every replica of that GPU Unhealthy. Baseline: the same append until
the same backend's event reaches the loop through the agent's HealthThread, i.e. what
the simulated hardware takes to report it (it polls its file).

Restart: the stand-in stops, then starts again (deleting every socket, creating
kubelet.sock), until every resource has registered again. Baseline: ReferencePlugin,
the least a plugin can do, on its own stand-in with the same number of resources.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import time
from collections.abc import Callable, Sequence

from bench.harness import MS, Figure, Target, now, percentile
from bench.noop import ReferencePlugin
from bench.plan import Plan
from bench.rigs import EXAMPLES, GPU, agent_rig, scratch, serving, time_slicing
from gpuslice.adapters.fake import FakeBackend
from gpuslice.core.devices import HealthEvent
from gpuslice.services.health_thread import HealthThread
from gpuslice.testing.kubelet import KubeletStandin

FIGURES = ("xid_unhealthy_p99", "restart_register_p99", "restart_register_mixed_p99")
SETTLE_S = 0.05  # no new registration for this long: a restart is over
JITTER_S = 0.025  # random wait before each injection, so it falls anywhere in a poll tick


def append_event(path: str, event: dict[str, int]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event) + "\n")


def gpu_unhealthy(gpu_uuid: str) -> Callable[[KubeletStandin], bool]:
    """A stand-in predicate: every replica of the GPU is listed Unhealthy."""

    def check(kubelet: KubeletStandin) -> bool:
        mine = [d for d in kubelet.devices(GPU).values() if d.id.startswith(gpu_uuid)]
        return bool(mine) and not any(d.healthy for d in mine)

    return check


async def xid_samples(rigs: int, rng: random.Random) -> list[float]:
    """Seconds from append to the unhealthy list, one per GPU of each fresh agent."""
    out: list[float] = []
    for _ in range(rigs):
        with scratch() as work:
            config = time_slicing(os.path.join(work, "ts48.yaml"), 48)
            async with agent_rig(work, "dgx-a100", config) as rig:
                for gpu in rig.node.devices.snapshot.gpus:
                    await asyncio.sleep(rng.uniform(0, JITTER_S))
                    t0 = now()
                    append_event(rig.events_path, {"gpu": gpu.index, "xid": 79})
                    await rig.kubelet.wait_for(gpu_unhealthy(gpu.uuid))
                    out.append(now() - t0)
    return out


async def detection_samples(count: int, rng: random.Random) -> list[float]:
    """Seconds from append to the backend's event arriving on the loop."""
    out: list[float] = []
    with scratch() as work:
        path = os.path.join(work, "events.jsonl")
        backend = FakeBackend.from_spec("dgx-a100", path)
        arrived: asyncio.Queue[float] = asyncio.Queue()

        def on_event(event: HealthEvent) -> None:
            arrived.put_nowait(now())

        with HealthThread(backend, on_event):
            for i in range(count):
                await asyncio.sleep(rng.uniform(0, JITTER_S))
                t0 = now()
                append_event(path, {"gpu": i % 8, "xid": 79})
                out.append(await asyncio.wait_for(arrived.get(), 5) - t0)
        backend.close()
    return out


async def xid_figure(plan: Plan) -> Figure:
    rng = random.Random(79)
    values: list[float] = []
    base: list[float] = []
    for _ in range(plan.trials):
        ours = await xid_samples(plan.xid_rigs, rng)
        values.append(percentile(ours, 99) * 1e3)
        base.append(percentile(await detection_samples(len(ours), rng), 99) * 1e3)
    return Figure(
        "xid_unhealthy_p99",
        "XID 79 appended -> every replica of the GPU Unhealthy at the stand-in, p99",
        MS,
        values,
        (Target(100.0),),
        base,
        "the simulated backend reporting the event (file poll + HealthThread), p99",
        {"samples_per_trial": 8 * plan.xid_rigs, "setup": "dgx-a100, 48 replicas per GPU"},
    )


async def restart_samples(
    kubelet: KubeletStandin, resources: Sequence[str], count: int
) -> list[float]:
    """Seconds from kubelet.sock re-created to the last resource's Register."""
    out: list[float] = []
    expected = {name: len(kubelet.devices(name)) for name in resources}
    for _ in range(count):
        seen = len(kubelet.registrations)
        await kubelet.stop()
        t0 = time.monotonic()
        await kubelet.start()
        await kubelet.wait_for(functools.partial(_all_registered, resources=resources, seen=seen))
        done = _registered(kubelet, resources, seen)
        assert done is not None
        out.append(done - t0)
        await _settle(kubelet, expected)
    return out


def _all_registered(kubelet: KubeletStandin, resources: Sequence[str], seen: int) -> bool:
    return _registered(kubelet, resources, seen) is not None


def _registered(kubelet: KubeletStandin, resources: Sequence[str], seen: int) -> float | None:
    """When the last of `resources` first registered after record `seen`, if all have."""
    first: dict[str, float] = {}
    for rec in kubelet.registrations[seen:]:
        if rec.accepted:
            first.setdefault(rec.resource, rec.at)
    if any(name not in first for name in resources):
        return None
    return max(first[name] for name in resources)


async def _settle(kubelet: KubeletStandin, expected: dict[str, int]) -> None:
    """Serving everything, and no registration for SETTLE_S."""
    while True:
        await kubelet.wait_for(lambda k: serving(k, expected))
        count = len(kubelet.registrations)
        await asyncio.sleep(SETTLE_S)
        if len(kubelet.registrations) == count and serving(kubelet, expected):
            return


async def restart_figure(
    plan: Plan, name: str, hardware: str, config: str | None, config_name: str | None
) -> Figure:
    values: list[float] = []
    base: list[float] = []
    with scratch() as work, scratch() as ref_dir:
        async with (
            agent_rig(work, hardware, config, config_name) as rig,
            KubeletStandin(ref_dir) as ref_kubelet,
        ):
            resources = sorted(rig.expected)
            fake = [f"bench.example/ref-{i}" for i in range(len(resources))]
            async with ReferencePlugin(ref_dir, fake):
                await _settle(ref_kubelet, {n: 0 for n in fake})
                await restart_samples(rig.kubelet, resources, 1)  # warm-up
                for _ in range(plan.trials):
                    ours = await restart_samples(rig.kubelet, resources, plan.restarts)
                    ref = await restart_samples(ref_kubelet, fake, plan.restarts)
                    values.append(percentile(ours, 99) * 1e3)
                    base.append(percentile(ref, 99) * 1e3)
    return Figure(
        name,
        f"kubelet.sock re-created -> Register for every resource ({len(resources)}), p99",
        MS,
        values,
        (Target(300.0),),
        base,
        "a no-op plugin re-serving and re-registering as many resources, p99",
        {
            "samples_per_trial": plan.restarts,
            "setup": f"{hardware}{f' ({config_name})' if config_name else ''}: "
            + ", ".join(resources),
        },
    )


async def run(plan: Plan) -> list[Figure]:
    xid = await xid_figure(plan)
    with scratch() as work:
        config = time_slicing(os.path.join(work, "ts48.yaml"), 48)
        single = await restart_figure(plan, "restart_register_p99", "dgx-a100", config, None)
    mixed = await restart_figure(
        plan,
        "restart_register_mixed_p99",
        "a100-40gb-mig-mixed",
        str(EXAMPLES / "time-slicing-configmap.yaml"),
        "a100-40gb",
    )
    return [xid, single, mixed]
