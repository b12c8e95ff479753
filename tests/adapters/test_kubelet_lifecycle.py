"""Kubelet restarts, plugin restarts and clean shutdown, over real unix sockets."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from kubelet_fakes import FakeHandler, exists, make_resource, open_fds

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.fswatch import CREATED, DELETED, DirEvent, DirWatcher
from gpuslice.testing.kubelet import AdmissionError, KubeletStandin

GPU = "nvidia.com/gpu"


async def _serve(
    kubelet: KubeletStandin, plugin_dir: str, handler: FakeHandler, socket_name: str | None = None
) -> DevicePluginServer:
    srv = DevicePluginServer(handler, plugin_dir, socket_name)
    await srv.start()
    await srv.register(kubelet.socket_path)
    await kubelet.wait_for(lambda k: k.endpoint(GPU) == srv.socket_name and k.updates(GPU) > 0)
    return srv


async def _next(watcher: DirWatcher) -> DirEvent:
    async with asyncio.timeout(5):
        return await anext(watcher)


async def test_restart_deletes_every_socket_and_creates_kubelet_sock_again(
    kubelet: KubeletStandin, plugin_dir: str
) -> None:
    srv = await _serve(kubelet, plugin_dir, FakeHandler(make_resource()))
    names = {"kubelet.sock", srv.socket_name}
    async with DirWatcher(plugin_dir, names, use_inotify=True) as watcher:
        await kubelet.restart()
        seen = [await _next(watcher) for _ in range(3)]
    assert set(seen[:2]) == {
        DirEvent("kubelet.sock", DELETED),
        DirEvent(srv.socket_name, DELETED),
    }
    assert seen[2] == DirEvent("kubelet.sock", CREATED)
    assert not srv.socket_present()
    assert kubelet.restarts == 1
    assert kubelet.node_status().capacity == {GPU: 0}
    await srv.stop(0)
    srv = await _serve(kubelet, plugin_dir, FakeHandler(make_resource()))
    assert kubelet.node_status().capacity == {GPU: 2}
    await srv.stop(0)


async def test_kubelet_sock_is_absent_during_the_restart_delay(
    kubelet: KubeletStandin, plugin_dir: str
) -> None:
    async with DirWatcher(plugin_dir, {"kubelet.sock"}) as watcher:
        restart = asyncio.create_task(kubelet.restart(delay=0.3))
        assert await _next(watcher) == DirEvent("kubelet.sock", DELETED)
        assert not exists(kubelet.socket_path)
        assert not kubelet.serving
        assert await _next(watcher) == DirEvent("kubelet.sock", CREATED)
        await restart
    assert kubelet.serving


async def test_allocations_survive_a_restart(kubelet: KubeletStandin, plugin_dir: str) -> None:
    handler = FakeHandler(make_resource(gpus=3, numa=(0, 0, 0)))
    srv = await _serve(kubelet, plugin_dir, handler)
    (first,) = await kubelet.admit("pod-1", {"main": {GPU: 2}})
    await kubelet.restart()
    await srv.stop(0)
    srv = await _serve(kubelet, plugin_dir, handler)
    assert kubelet.allocations() == {"pod-1": {"main": {GPU: first.device_ids}}}
    (second,) = await kubelet.admit("pod-2", {"main": {GPU: 1}})
    assert set(second.device_ids).isdisjoint(first.device_ids)
    with pytest.raises(AdmissionError, match="Available: 0"):
        await kubelet.admit("pod-3", {"main": {GPU: 1}})
    await srv.stop(0)


async def test_plugin_stream_ending_marks_its_devices_unhealthy(
    kubelet: KubeletStandin, plugin_dir: str
) -> None:
    srv = await _serve(kubelet, plugin_dir, FakeHandler(make_resource()))
    await srv.stop(0)
    await kubelet.wait_for(lambda k: k.endpoint(GPU) is None)
    status = kubelet.node_status()
    assert (status.capacity[GPU], status.allocatable[GPU]) == (2, 0)
    assert not any(d.healthy for d in kubelet.devices(GPU).values())
    with pytest.raises(AdmissionError, match="no healthy devices present"):
        await kubelet.admit("pod-1", {"main": {GPU: 1}})
    assert kubelet.stale_streams == []


async def test_a_clean_plugin_restart_never_leaves_a_stale_stream(
    kubelet: KubeletStandin, plugin_dir: str
) -> None:
    handler = FakeHandler(make_resource())
    srv = await _serve(kubelet, plugin_dir, handler)
    for _ in range(3):
        await srv.stop(1)
        # Clean: the kubelet has seen the stream end (its endpoint stopped) before the next
        # registration, as the agent's hand-over waits for; the other order is the race
        # test_an_old_instance_ending_after_a_new_one_registered_drops_the_resource shows.
        await kubelet.wait_for(lambda k: k.endpoint(GPU) is None)
        srv = await _serve(kubelet, plugin_dir, handler)
        await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 2)
    assert kubelet.stale_streams == []
    assert [r.accepted for r in kubelet.registrations] == [True] * 4
    await srv.stop(0)


async def test_an_old_instance_ending_after_a_new_one_registered_drops_the_resource(
    kubelet: KubeletStandin, plugin_dir: str
) -> None:
    """As the real kubelet: a second plugin registers the same resource while the
    first still streams; the first is neither told nor cut off, and pods go to the
    second. When the first then ends, every device of the resource turns Unhealthy
    (capacity kept), the second's stream is cancelled and pods fail, until a plugin
    registers again."""
    old_handler, new_handler = FakeHandler(make_resource()), FakeHandler(make_resource())
    old = await _serve(kubelet, plugin_dir, old_handler)
    new = await _serve(kubelet, plugin_dir, new_handler, "nvidia-gpu-2.sock")
    assert kubelet.stale_streams == []
    assert kubelet.node_status().allocatable[GPU] == 2  # both stream; the new one is used
    await kubelet.admit("pod-0", {"main": {GPU: 1}})
    assert (len(old_handler.allocate_calls), len(new_handler.allocate_calls)) == (0, 1)

    await old.stop(0)
    await kubelet.wait_for(lambda k: k.endpoint(GPU) is None)
    (stale,) = kubelet.stale_streams
    assert (stale.resource, stale.old_endpoint, stale.new_endpoint) == (
        GPU,
        "nvidia-gpu.sock",
        "nvidia-gpu-2.sock",
    )
    async with asyncio.timeout(5):
        await new.wait_dropped()  # the new plugin saw the kubelet cancel its stream
    status = kubelet.node_status()
    assert (status.capacity[GPU], status.allocatable[GPU]) == (2, 0)
    assert not any(d.healthy for d in kubelet.devices(GPU).values())
    with pytest.raises(AdmissionError, match="no healthy devices present") as err:
        await kubelet.admit("pod-1", {"main": {GPU: 1}})
    assert err.value.reason == "UnexpectedAdmissionError"

    await new.register(kubelet.socket_path)  # the surviving plugin registers again
    await kubelet.wait_for(lambda k: k.serves({GPU: 2}))
    await new.stop(0)


async def _settle() -> None:
    """Let tasks still running (gRPC finishing a close) end on their own; a task
    that never ends is a leak and times out here."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    async with asyncio.timeout(5):
        await asyncio.gather(*others, return_exceptions=True)


async def _fds_back_to(count: int, timeout_s: float = 5.0) -> list[str]:
    """Wait until no more than `count` fds are open; else the extra ones and what they are.
    Counted, not compared by number: gRPC's core may shut its pollers down in a thread of
    its own and open them again under other numbers; a leak keeps the count up."""
    deadline = time.monotonic() + timeout_s
    while len(now := open_fds()) > count:
        if time.monotonic() > deadline:
            return [f"{fd} -> {_target(fd)}" for fd in sorted(now, key=int)]
        await asyncio.sleep(0.05)
    return []


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "(closed)"


async def test_stop_leaves_no_sockets_fds_or_tasks(plugin_dir: str) -> None:
    async def cycle() -> None:
        async with KubeletStandin(plugin_dir) as kubelet:
            srv = await _serve(kubelet, plugin_dir, FakeHandler(make_resource()))
            await kubelet.admit("pod", {"main": {GPU: 1}})
            await kubelet.restart()
            await srv.stop(0)
            srv = await _serve(kubelet, plugin_dir, FakeHandler(make_resource()))
            await srv.stop(0)
        os.unlink(kubelet.checkpoint_path)

    await cycle()  # gRPC sets up its process-wide machinery once
    await _settle()
    fds = open_fds()
    await cycle()
    await cycle()
    await _settle()
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert await _fds_back_to(len(fds)) == []
    assert os.listdir(plugin_dir) == []


async def test_a_list_from_an_older_client_lands_but_a_stopped_endpoint_refuses_allocate(
    kubelet: KubeletStandin, plugin_dir: str
) -> None:
    """As the kubelet's device manager: a list from any client of a resource is the
    resource's, current or not; and the disconnect that an old stream's end causes
    stops the endpoint in place, which refuses Allocate even once devices are healthy
    again, until a plugin registers anew."""
    handlers = [FakeHandler(make_resource()) for _ in range(3)]
    first = await _serve(kubelet, plugin_dir, handlers[0])
    second = await _serve(kubelet, plugin_dir, handlers[1], "nvidia-gpu-2.sock")
    third = await _serve(kubelet, plugin_dir, handlers[2], "nvidia-gpu-3.sock")
    dev = min(kubelet.devices(GPU))
    handlers[1].set_healthy(dev, False)  # the second, no longer current, sends a list
    await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 1)

    await first.stop(0)  # the oldest stream ends: the third, current, is disconnected
    await kubelet.wait_for(lambda k: k.endpoint(GPU) is None)
    assert kubelet.node_status().allocatable[GPU] == 0
    handlers[1].set_healthy(dev, True)  # the second still streams: its list lands
    await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 2)
    with pytest.raises(AdmissionError, match="has been stopped"):
        await kubelet.admit("pod-1", {"main": {GPU: 1}})
    assert not handlers[2].allocate_calls

    await second.register(kubelet.socket_path)  # a fresh registration serves again
    await kubelet.wait_for(lambda k: k.endpoint(GPU) == "nvidia-gpu-2.sock")
    await kubelet.admit("pod-2", {"main": {GPU: 1}})
    for srv in (second, third):
        await srv.stop(0)
