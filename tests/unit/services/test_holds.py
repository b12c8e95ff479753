"""The hold service (services.holds) over the node's device state and a plugin manager:
a GPU in use under another resource is held beside XID health (each keeps its own
marks), released when its
container is gone; a failing PodResources keeps the holds and is logged once; the
periodic check runs on an injected sleep."""

from __future__ import annotations

import asyncio

import structlog
from health_fakes import Node, mixed_node, serve

from gpuslice.core.sharing import GPU_RESOURCE
from gpuslice.core.usage import CheckpointEntry, ContainerDevices
from gpuslice.services.holds import DeviceHolds
from gpuslice.services.node_devices import HEALTH

SHARED = "nvidia.com/gpu.shared"


class Pods:
    """PodResources as a kubelet would answer: `listed`, or BackendError-like failure."""

    def __init__(self) -> None:
        self.listed: list[ContainerDevices] = []
        self.down: str | None = None
        self.calls = 0

    async def list(self) -> tuple[ContainerDevices, ...]:
        self.calls += 1
        if self.down is not None:
            raise ConnectionError(self.down)
        return tuple(self.listed)

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        return {}

    def pod_uids(self) -> tuple[CheckpointEntry, ...]:
        return ()


def on(node: Node, resource: str) -> set[bool]:
    return {ok for d, ok in node.manager.handlers[resource].devices()}


async def moved_gpu() -> tuple[Node, Pods, DeviceHolds, str]:
    """The mixed node (GPU 1 in three replicas as gpu.shared) with a container that
    still holds GPU 1 whole under nvidia.com/gpu."""
    node = await serve(*mixed_node())
    pods = Pods()
    gpu1 = node.snapshot.gpus[1].uuid
    pods.listed = [ContainerDevices("ns", "old", "c", GPU_RESOURCE, (gpu1,))]
    holds = DeviceHolds(pods, lambda h: node.devices.hold(h, by="moved"))
    return node, pods, holds, gpu1


async def test_a_hold_and_xid_health_each_keep_their_marks() -> None:
    node, pods, holds, gpu1 = await moved_gpu()
    await holds.check(node.snapshot, node.resources)
    assert holds.held == {gpu1}
    assert on(node, SHARED) == {False}
    assert on(node, "nvidia.com/mig-1g.5gb") == {True}  # GPU 0's MIG devices: not held

    node.devices.hold(frozenset(), by=HEALTH)  # health says all is well: the hold stays
    assert on(node, SHARED) == {False}
    node.devices.hold(frozenset({gpu1}), by=HEALTH)  # an XID on GPU 1
    pods.listed = []  # the old container is gone
    await holds.check(node.snapshot, node.resources)
    assert holds.held == frozenset()
    assert on(node, SHARED) == {False}  # still unhealthy by XID
    node.devices.hold(frozenset(), by=HEALTH)
    assert on(node, SHARED) == {True}


async def test_a_failing_pod_resources_keeps_the_holds_and_is_logged_once() -> None:
    node, pods, holds, gpu1 = await moved_gpu()
    await holds.check(node.snapshot, node.resources)
    pods.listed, pods.down = [], "kubelet gone"
    with structlog.testing.capture_logs() as logs:
        await holds.check(node.snapshot, node.resources)
        await holds.check(node.snapshot, node.resources)
        assert holds.held == {gpu1}
        assert holds.error == "kubelet gone"
        assert on(node, SHARED) == {False}
        pods.down = None
        await holds.check(node.snapshot, node.resources)
    assert holds.held == frozenset()
    assert holds.error is None
    assert on(node, SHARED) == {True}
    assert [e["event"] for e in logs] == [
        "pod_resources_unavailable_keeping_holds",
        "pod_resources_available",
        "device_released",
    ]


async def test_nothing_known_holds_nothing() -> None:
    """PodResources absent from the start: served as without holds."""
    node, pods, holds, _ = await moved_gpu()
    pods.down = "no such socket"
    await holds.check(node.snapshot, node.resources)
    assert holds.held == frozenset()
    assert on(node, SHARED) == {True}


async def test_the_periodic_check_releases_a_hold_once_its_container_is_gone() -> None:
    node, pods, _, gpu1 = await moved_gpu()
    ticks: asyncio.Queue[None] = asyncio.Queue()
    pushed: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await ticks.get()

    def hold(held: frozenset[str]) -> None:
        node.devices.hold(held, by="moved")
        pushed.put_nowait(held)

    holds = DeviceHolds(pods, hold, sleep=sleep)
    task = asyncio.create_task(holds.run(lambda: (node.snapshot, node.resources)))
    try:
        async with asyncio.timeout(5):
            ticks.put_nowait(None)
            assert await pushed.get() == {gpu1}
            pods.listed = []
            ticks.put_nowait(None)
            assert await pushed.get() == frozenset()
        assert on(node, SHARED) == {True}
        assert slept[:2] == [holds.interval_s] * 2
        assert pods.calls == 2
    finally:
        task.cancel()
