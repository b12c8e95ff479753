"""Behavioural fakes for the health monitor tests: a scripted GpuBackend, a clock,
no-op plugin endpoints, and a served node (real PluginManager and handlers)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuslice.adapters.fake import load_spec
from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.resources import AdvertisedDevice, Resource, build_resources
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import (
    MIG_MIXED,
    TIME_SLICING,
    ReplicaRule,
    ResourceSettings,
    SharingPlan,
)
from gpuslice.frontends.deviceplugin.manager import PluginManager
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.services.node_devices import HEALTH, NodeDevices


class ScriptedBackend:
    """A GpuBackend whose events and wait failures a test pushes, and whose probe
    answers a test sets per device (True unless told otherwise)."""

    def __init__(self, snapshot: HardwareSnapshot) -> None:
        self._snapshot = snapshot
        self._queue: queue.Queue[HealthEvent | Exception] = queue.Queue()
        self._lock = threading.Lock()
        self._answers: dict[str, bool] = {}
        self.probed: list[str] = []
        self.waits = 0
        self.closed = threading.Event()

    def push(self, item: HealthEvent | Exception) -> None:
        self._queue.put(item)

    def answer(self, device: str, ok: bool) -> None:
        with self._lock:
            self._answers[device] = ok

    def snapshot(self) -> HardwareSnapshot:
        return self._snapshot

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        with self._lock:
            self.waits += 1
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    def probe(self, gpu_uuid: str) -> bool:
        with self._lock:
            self.probed.append(gpu_uuid)
            return self._answers.get(gpu_uuid, True)

    def mig_control(self) -> None:
        return None

    def memory_limits(self) -> None:
        return None

    def process_owners(self) -> None:
        return None

    def close(self) -> None:
        self.closed.set()


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class NullEndpoint:
    async def start(self) -> None: ...

    async def register(self) -> None: ...

    async def stop(self) -> None: ...

    def current(self) -> bool:
        return True

    def socket_present(self) -> bool:
        return True

    def down(self) -> str | None:
        return None

    def release_socket(self) -> None:
        return None

    async def end_streams(self, timeout_s: float) -> bool:
        return True

    async def wait_dropped(self) -> None:
        await asyncio.Event().wait()  # the kubelet never drops it

    async def wait_down(self) -> str:
        await asyncio.Event().wait()  # never goes down
        return ""


def endpoint(handler: ResourceHandler) -> NullEndpoint:
    return NullEndpoint()


def mixed_node() -> tuple[HardwareSnapshot, ResourceSettings]:
    """GPU 0 in MIG mode (3g.20gb gi 2, 2g.10gb gi 3, 1g.5gb gi 9 and 10), GPU 1 whole;
    1g.5gb devices and the whole GPU time-sliced three ways."""
    plan = SharingPlan(
        strategy=TIME_SLICING,
        rules=(
            ReplicaRule(name="nvidia.com/mig-1g.5gb", replicas=3),
            ReplicaRule(name="nvidia.com/gpu", replicas=3, rename="nvidia.com/gpu.shared"),
        ),
    )
    return load_spec("a100-40gb-mig-mixed"), ResourceSettings(MIG_MIXED, plan)


@dataclass
class Node:
    snapshot: HardwareSnapshot
    resources: tuple[Resource, ...]
    manager: PluginManager
    changes: asyncio.Queue[frozenset[str]]
    devices: NodeDevices  # merges health with every hold, as the agent's node state does

    def on_change(self, unhealthy: frozenset[str]) -> list[str]:
        self.changes.put_nowait(unhealthy)
        return self.devices.hold(unhealthy, by=HEALTH)

    def health(self) -> dict[str, bool]:
        """Kubelet device ID -> healthy, over every served resource."""
        return {d.id: ok for h in self.manager.handlers.values() for d, ok in h.devices()}

    def unhealthy_ids(self) -> set[str]:
        return {i for i, ok in self.health().items() if not ok}

    def ids_on(self, match: Callable[[AdvertisedDevice], bool]) -> set[str]:
        return {d.id for r in self.resources for d in r.devices if match(d)}

    async def next_change(self) -> frozenset[str]:
        """The next published unhealthy set (fails the test after 5 s)."""
        async with asyncio.timeout(5):
            return await self.changes.get()

    def drain(self) -> list[frozenset[str]]:
        """Every change published so far, oldest first."""
        out = []
        while not self.changes.empty():
            out.append(self.changes.get_nowait())
        return out


async def serve(snapshot: HardwareSnapshot, settings: ResourceSettings) -> Node:
    resources = build_resources(snapshot, settings)
    manager = PluginManager(endpoint)
    await manager.apply(resources, AllocateOptions(), None)
    devices = NodeDevices(lambda: ScriptedBackend(snapshot))  # never opened here
    devices.on_unhealthy(manager.set_unhealthy)
    return Node(snapshot, resources, manager, asyncio.Queue(), devices)
