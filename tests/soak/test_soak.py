"""Soak: 100 kubelet restarts and 10,000 Allocates with XIDs injected in between,
on a simulated node of six A100s (two in MIG mode) serving four resources.

After every restart each resource registers again and streams the list the
injected faults call for; every GetPreferredAllocation keeps to the healthy,
free devices it was offered; every Allocate exposes exactly the physical GPUs or
MIG devices behind the requested replicas. Nothing leaks.

GPUSLICE_SOAK_SCALE scales both counts (1 = the full size). Unset, the full size
runs under `-m soak` and a tenth of it otherwise (plain pytest, `python3 dev.py
test`, `.ci/run`). Timings are printed (pytest -s shows them).
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from agent_harness import AgentLauncher, RunningAgent, gpus_of, registrations, remove_dir, short_dir
from faults_harness import Census, no_leaks, summary_ms

from gpuslice.testing.kubelet import KubeletStandin

RESTARTS, ALLOCATES = 100, 10_000
SHORT_SCALE = 0.1
GPU = "nvidia.com/gpu"
MIG_1G = "nvidia.com/mig-1g.5gb"
HELD = 6  # allocations kept at once, so what is free keeps changing
MAX_MARKED = 3  # of six GPUs, so one plain GPU at least stays healthy
NODE = """\
name: soak-node
gpus:
  - model: a100-40gb
    mig_enabled: true
    mig_devices: &mig
      - {profile: 3g.20gb, gi: 2}
      - {profile: 2g.10gb, gi: 3}
      - {profile: 1g.5gb, gi: 9}
      - {profile: 1g.5gb, gi: 10}
  - {model: a100-40gb, mig_enabled: true, mig_devices: *mig}
  - {model: a100-40gb, count: 4}
"""
CONFIG = """\
version: v1
flags: {migStrategy: mixed}
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, replicas: 4}
    - {name: nvidia.com/mig-1g.5gb, replicas: 2}
"""
# Marks stay until a "recovered" event says otherwise: no re-probe, no flap cap.
HEALTH_ENV = {"GPUSLICE_HEALTH_HOLDDOWN": "infinite", "GPUSLICE_HEALTH_MAX_FLAPS": "1000000"}


def _scale(config: pytest.Config) -> float:
    text = os.environ.get("GPUSLICE_SOAK_SCALE", "").strip()
    if text:
        return float(text)
    return 1.0 if "soak" in (config.getoption("markexpr") or "") else SHORT_SCALE


@dataclass
class Timings:
    restart: list[float] = field(default_factory=list)  # kubelet back -> all re-registered
    marked: list[float] = field(default_factory=list)  # XID written -> lists updated
    recovered: list[float] = field(default_factory=list)  # recovered written -> lists updated
    allocate: list[float] = field(default_factory=list)  # GetPreferredAllocation + Allocate


class Soak:
    """The running agent, the faults injected so far and what they imply."""

    def __init__(self, running: RunningAgent, kubelet: KubeletStandin, seed: int) -> None:
        self.running, self.kubelet = running, kubelet
        self.rng = random.Random(seed)
        self.marked: set[str] = set()  # physical GPU or MIG UUIDs marked by injected XIDs
        self.held: deque[tuple[str, tuple[str, ...]]] = deque()
        self.allocates = 0
        self.timings = Timings()
        handlers = running.plugin.manager.handlers
        self.behind = {  # device ID -> (its GPU's UUID, its physical GPU or MIG UUID)
            d.id: (d.gpu_uuid, d.physical_id) for h in handlers.values() for d, _ in h.devices()
        }
        self.resources = sorted(handlers)

    def healthy(self, device_id: str) -> bool:
        gpu, physical = self.behind[device_id]
        return gpu not in self.marked and physical not in self.marked

    def lists_match(self, k: KubeletStandin) -> bool:
        """Every resource streams every device, with the health the faults imply."""
        for name in self.resources:
            devices = k.devices(name)
            if k.endpoint(name) is None or devices.keys() != self._ids(name):
                return False
            if any(d.healthy != self.healthy(d.id) for d in devices.values()):
                return False
        return True

    def _ids(self, name: str) -> set[str]:
        return {d.id for d, _ in self.running.plugin.manager.handlers[name].devices()}

    async def inject_fault(self) -> None:
        """Recover one marked GPU, or mark a GPU or one MIG device (XID 94, transient)."""
        gpus = self.running.devices.snapshot.gpus
        if len(self.marked) >= MAX_MARKED or (self.marked and self.rng.random() < 0.5):
            gpu = self.rng.choice([g for g in gpus if self._touches(g.uuid)])
            self.running.inject(gpu=gpu.index, recovered=True)
            self.marked -= {gpu.uuid, *(m.uuid for m in gpu.mig_devices)}
            await self._reflected(self.timings.recovered)
            return
        gpu = self.rng.choice(gpus)
        if gpu.mig_devices and self.rng.random() < 0.5:
            mig = self.rng.choice(gpu.mig_devices)
            self.running.inject(gpu=gpu.index, mig=mig.index, xid=94)
            self.marked.add(mig.uuid)
        else:
            self.running.inject(gpu=gpu.index, xid=94)
            self.marked.add(gpu.uuid)
        await self._reflected(self.timings.marked)

    def _touches(self, gpu_uuid: str) -> bool:
        gpu = self.running.devices.snapshot.gpu_by_uuid(gpu_uuid)
        assert gpu is not None
        return bool(self.marked & {gpu.uuid, *(m.uuid for m in gpu.mig_devices)})

    async def _reflected(self, into: list[float]) -> None:
        started = time.monotonic()
        await self.kubelet.wait_for(self.lists_match)
        into.append(time.monotonic() - started)

    async def restart_kubelet(self) -> None:
        await self.kubelet.restart()
        started = time.monotonic()
        want = self.kubelet.restarts + 1  # the first registration, then one per restart
        await self.kubelet.wait_for(
            lambda k: (
                self.lists_match(k) and all(registrations(k)[n] == want for n in self.resources)
            )
        )
        self.timings.restart.append(time.monotonic() - started)
        assert self.kubelet.stale_streams == []

    async def allocate(self) -> None:
        """One container's admission as the kubelet makes it, every answer checked."""
        name = self.rng.choice([GPU, GPU, GPU, MIG_1G, *self.resources])
        count = 2 if name in (GPU, MIG_1G) and self.rng.random() < 0.3 else 1
        while len(free := self._free(name)) < count:
            if self.held:
                self.held.popleft()  # a pod ends
            else:  # every device of it is marked: ask for one whole-GPU replica instead
                name, count = GPU, 1
        started = time.monotonic()
        preferred = await self.kubelet.preferred_allocation(name, free, [], count)
        (allocation,) = await self.kubelet.allocate(name, [preferred])
        self.timings.allocate.append(time.monotonic() - started)
        self.allocates += 1
        assert len(set(preferred)) == count, (name, preferred)
        assert set(preferred) <= set(free), (name, preferred)
        assert all(self.healthy(d) for d in preferred), "an unhealthy device was preferred"
        visible = allocation.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(visible) == len(set(visible))
        assert set(visible) == gpus_of(preferred), (preferred, visible)
        if count == 2 and name == GPU and len({self.behind[d][0] for d in free}) > 1:
            assert len(visible) == 2, "distributed: two replicas on two GPUs when it can"
        self.held.append((name, tuple(preferred)))
        if len(self.held) > HELD:
            self.held.popleft()

    def _free(self, name: str) -> list[str]:
        """Healthy devices of `name` no held allocation has: what the kubelet offers."""
        taken = {d for _, ids in self.held for d in ids}
        return sorted(d for d in self._ids(name) if self.healthy(d) and d not in taken)


@pytest.fixture
def node_files() -> Iterator[tuple[Path, Path]]:
    folder = Path(short_dir("gss-"))
    (folder / "node.yaml").write_text(NODE)
    (folder / "config.yaml").write_text(CONFIG)
    try:
        yield folder / "node.yaml", folder / "config.yaml"
    finally:
        remove_dir(str(folder))


@pytest.mark.soak
@pytest.mark.timeout(900)
async def test_kubelet_restarts_and_allocations_with_xids_in_between(
    request: pytest.FixtureRequest, node_files: tuple[Path, Path]
) -> None:
    scale = _scale(request.config)
    restarts, allocates = max(1, round(RESTARTS * scale)), max(10, round(ALLOCATES * scale))
    node, config = node_files
    plugin_dir = short_dir("gss-")
    launcher = AgentLauncher(plugin_dir)
    try:
        async with KubeletStandin(plugin_dir) as kubelet:
            running = await launcher.start(str(node), config=config, env=HEALTH_ENV)
            await running.registered(kubelet)
            soak = Soak(running, kubelet, seed=restarts * 7919 + allocates)
            assert running.served == {
                GPU: 16,
                MIG_1G: 8,
                "nvidia.com/mig-2g.10gb": 2,
                "nvidia.com/mig-3g.20gb": 2,
            }
            await soak.restart_kubelet()  # warm-up: every path once before the census
            soak.timings = Timings()
            before, started = Census.take(), time.monotonic()

            per_round = allocates // restarts
            for r in range(restarts):
                budget = per_round if r < restarts - 1 else allocates - soak.allocates
                for i in range(budget):
                    if i == budget // 2:
                        await soak.inject_fault()
                    await soak.allocate()
                await soak.inject_fault()
                await soak.restart_kubelet()
            elapsed = time.monotonic() - started

            t = soak.timings
            print(
                f"\nsoak x{scale:g}: {restarts} kubelet restarts, {soak.allocates} Allocates, "
                f"{len(t.marked)} XIDs, {len(t.recovered)} recoveries in {elapsed:.1f} s\n"
                f"  kubelet restart -> every resource re-registered: {summary_ms(t.restart)}\n"
                f"  XID -> Unhealthy in the lists: {summary_ms(t.marked)}\n"
                f"  recovered -> Healthy in the lists: {summary_ms(t.recovered)}\n"
                f"  GetPreferredAllocation + Allocate: {summary_ms(t.allocate)}"
            )
            assert soak.allocates == allocates
            assert kubelet.restarts == restarts + 1
            assert all(registrations(kubelet)[n] == restarts + 2 for n in soak.resources)
            assert kubelet.stale_streams == []
            assert not running.task.done()
            await no_leaks(before)
    finally:
        await launcher.close()
        remove_dir(plugin_dir)
