"""The real endpoint over real unix sockets: its crash watch, which kubelet its
registration went to, a socket another live plugin serves, and the lock that
keeps a second agent off the device-plugin directory."""

from __future__ import annotations

import asyncio
import os

import pytest
from kubelet_fakes import FakeHandler, make_resource

from gpuslice.adapters.deviceplugin import DevicePluginServer, KubeletEndpoint, RegistrationError
from gpuslice.adapters.deviceplugin.dirlock import (
    HOLDER_FILE,
    WAITING_FILE,
    DirLock,
    Holder,
    acquire,
    claim,
    successor_waiting,
)
from gpuslice.adapters.deviceplugin.handover import DirClaim
from gpuslice.core.ports import SocketTaken
from gpuslice.testing.kubelet import KubeletStandin

GPU = "nvidia.com/gpu"


def _endpoint(plugin_dir: str) -> KubeletEndpoint:
    kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
    return KubeletEndpoint.create(FakeHandler(make_resource()), plugin_dir, kubelet_socket)


async def test_the_crash_watch_reports_a_grpc_server_that_ended_on_its_own(
    plugin_dir: str,
) -> None:
    endpoint = _endpoint(plugin_dir)
    await endpoint.start()
    assert endpoint.down() is None
    watching = asyncio.create_task(endpoint.wait_down())
    grpc_server = endpoint.server._server  # ended under the adapter, as a gRPC failure would
    assert grpc_server is not None
    await grpc_server.stop(None)
    reason = await asyncio.wait_for(watching, 5)
    assert reason == f"the gRPC server for {GPU} stopped on its own"
    assert endpoint.down() == reason
    assert not endpoint.socket_present()
    await endpoint.stop()

    await endpoint.start()  # started again: a fresh watch, nothing down
    assert endpoint.down() is None
    await endpoint.stop()
    assert endpoint.down() is None  # stopped on purpose is not down


async def test_current_means_registered_with_the_kubelet_serving_now(plugin_dir: str) -> None:
    endpoint = _endpoint(plugin_dir)
    await endpoint.start()
    try:
        with pytest.raises(RegistrationError, match="UNAVAILABLE: no kubelet yet"):
            await endpoint.register()  # at once: kubelet.sock appearing is watched for
    finally:
        await endpoint.stop()
    async with KubeletStandin(plugin_dir) as kubelet:  # a starting kubelet clears sockets
        await endpoint.start()
        try:
            assert not endpoint.current()
            await endpoint.register()
            assert endpoint.current()
            await kubelet.restart()  # kubelet.sock created again, our socket deleted
            assert not endpoint.current()
            await endpoint.stop()
            await endpoint.start()
            await endpoint.register()
            assert endpoint.current()
        finally:
            await endpoint.stop()


async def test_a_socket_another_live_plugin_serves_is_left_alone(plugin_dir: str) -> None:
    other = DevicePluginServer(FakeHandler(make_resource()), plugin_dir)
    await other.start()
    endpoint = _endpoint(plugin_dir)
    with pytest.raises(SocketTaken) as taken:
        await endpoint.start()
    path = os.path.join(plugin_dir, "nvidia-gpu.sock")
    assert str(taken.value) == (
        f"another device plugin serves {GPU} on {path}; "
        "gpuslice leaves it alone and serves once it is gone"
    )
    assert other.socket_present()  # the same file, still served
    await endpoint.stop()
    assert other.socket_present()

    await other.stop()
    await endpoint.start()
    assert endpoint.socket_present()
    await endpoint.stop()


def _holder(n: int) -> Holder:
    return Holder(pid=1000 + n, pod=f"gpuslice-{n}", node="node-a", host=f"gpuslice-{n}")


async def test_a_second_agent_waits_for_the_directory_lock_and_knows_who_holds_it(
    plugin_dir: str,
) -> None:
    first, second = DirLock(plugin_dir, _holder(1)), DirLock(plugin_dir, _holder(2))
    assert first.try_acquire()
    assert not second.try_acquire()
    assert second.holder() == "pid 1001, pod gpuslice-1, node node-a"
    waiting = asyncio.create_task(acquire(second, asyncio.Event(), poll_s=0.01))
    await asyncio.sleep(0.05)  # several polls while the first one holds it
    assert not waiting.done()

    first.release()
    assert await asyncio.wait_for(waiting, 5)
    assert first.holder() == "pid 1002, pod gpuslice-2, node node-a"
    second.release()
    assert HOLDER_FILE not in os.listdir(plugin_dir)


async def test_waiting_for_the_lock_ends_when_the_agent_is_stopped(plugin_dir: str) -> None:
    first, second = DirLock(plugin_dir, _holder(1)), DirLock(plugin_dir, _holder(2))
    assert first.try_acquire()
    stop = asyncio.Event()
    waiting = asyncio.create_task(acquire(second, stop, poll_s=0.01))
    stop.set()
    assert not await asyncio.wait_for(waiting, 5)
    assert not second.held
    first.release()


async def test_a_missing_directory_is_waited_for_then_locked(plugin_dir: str) -> None:
    later = os.path.join(plugin_dir, "device-plugins")
    claiming = asyncio.create_task(claim(later, _holder(1), asyncio.Event()))
    await asyncio.sleep(0.05)  # the claim is waiting, not failing
    assert not claiming.done()
    os.mkdir(later)
    lock = await asyncio.wait_for(claiming, 5)
    assert lock is not None
    assert lock.held
    lock.release()

    stop = asyncio.Event()
    stop.set()
    assert await claim(os.path.join(plugin_dir, "never"), _holder(1), stop) is None


async def test_a_hand_over_waits_for_the_successor_to_say_it_serves(plugin_dir: str) -> None:
    old, new = DirLock(plugin_dir, _holder(1)), DirLock(plugin_dir, _holder(2))
    assert old.try_acquire()
    told: list[str] = []
    taking = asyncio.create_task(acquire(new, asyncio.Event(), waiting=told.append))
    handing = asyncio.create_task(DirClaim(old).hand_over(arrive_s=5.0))
    assert await asyncio.wait_for(taking, 5)
    assert told == ["pid 1001, pod gpuslice-1, node node-a"]
    await asyncio.sleep(0.05)  # several polls: the successor holds it, not yet serving
    assert not handing.done()
    DirClaim(new).serving()
    assert await asyncio.wait_for(handing, 5)
    new.release()


async def test_a_hand_over_with_no_successor_ends_at_once(plugin_dir: str) -> None:
    lock = DirLock(plugin_dir, _holder(1))
    assert lock.try_acquire()
    lock.mark_serving()
    assert not await DirClaim(lock).hand_over(arrive_s=0.05)
    assert not lock.held
    assert HOLDER_FILE not in os.listdir(plugin_dir)


async def test_the_same_pid_in_another_pod_is_another_agent(plugin_dir: str) -> None:
    """Two pods' agents may both be PID 1 in their namespaces: the token tells them apart."""
    old = DirLock(plugin_dir, Holder(1, token="a"))
    new = DirLock(plugin_dir, Holder(1, token="b"))
    assert old.try_acquire()
    handing = asyncio.create_task(DirClaim(old).hand_over(arrive_s=5.0))
    assert await asyncio.wait_for(acquire(new, asyncio.Event()), 5)
    new.mark_serving()
    assert await asyncio.wait_for(handing, 5)
    new.release()


async def test_a_hand_over_waits_for_a_successor_however_slowly_it_takes_the_lock(
    plugin_dir: str,
) -> None:
    """A successor waiting for the lock says so (a shared flock the kernel drops with
    it): the old agent waits for it even when it is slow to take the lock (a loaded
    machine), rather than ending its streams after a fixed 0.1 s."""
    old, new = DirLock(plugin_dir, _holder(1)), DirLock(plugin_dir, _holder(2))
    assert old.try_acquire()
    waiting = asyncio.Event()
    slow = 20 * 0.05  # the successor looks at the lock far less often than arrive_s
    taking = asyncio.create_task(
        acquire(new, asyncio.Event(), poll_s=slow, waiting=lambda _: waiting.set())
    )
    await waiting.wait()
    assert successor_waiting(plugin_dir)
    handing = asyncio.create_task(DirClaim(old).hand_over(arrive_s=0.05))
    assert await asyncio.wait_for(taking, 10)
    assert not successor_waiting(plugin_dir)
    assert WAITING_FILE not in os.listdir(plugin_dir)  # the last waiter removes it
    assert not handing.done()
    DirClaim(new).serving()
    assert await asyncio.wait_for(handing, 10)
    new.release()


async def test_a_waiter_that_died_is_not_waited_for(plugin_dir: str) -> None:
    old, new = DirLock(plugin_dir, _holder(1)), DirLock(plugin_dir, _holder(2))
    assert old.try_acquire()
    stop = asyncio.Event()
    waiting = asyncio.Event()
    taking = asyncio.create_task(acquire(new, stop, waiting=lambda _: waiting.set()))
    await waiting.wait()
    stop.set()  # it gives up (as a process that ends drops its flock)
    assert not await taking
    assert not successor_waiting(plugin_dir)
    assert not await DirClaim(old).hand_over(arrive_s=0.05)
