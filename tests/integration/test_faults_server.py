"""A device-plugin server that dies or cannot start: its supervisor starts it
again and re-registers, within a budget (more than 5 failures of one resource,
each within an hour of the previous, as upstream); once the budget is spent the
agent stops everything and run() raises PluginServerFailed, so `gpuslice run`
exits non-zero with one line and Kubernetes restarts the pod. The agents here
serve through the endpoints `gpuslice run` builds: the crash watch is theirs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Collection

import pytest
from agent_harness import EXAMPLES, GPU, RunningAgent, is_socket, registrations, serving
from conftest import Logged
from faults_harness import (
    Census,
    FaultLauncher,
    end_grpc_server,
    eventually,
    no_leaks,
    recorded_endpoints,
    summary_ms,
)

from gpuslice.adapters.deviceplugin.endpoint import KubeletEndpoint
from gpuslice.adapters.deviceplugin.server import DevicePluginServer, ServerError
from gpuslice.core.ports import PluginEndpoint
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions
from gpuslice.core.restart import RestartBudget
from gpuslice.frontends.deviceplugin.manager import PluginManager, PluginServerFailed
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.services.agent import AgentTaskFailed
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.agent import Parts

QUICK = RestartBudget(first_delay_s=0.01, max_delay_s=0.05)  # upstream's count, short backoff
# Room to act between the first failed starts and the sixth.
SLOWER = RestartBudget(first_delay_s=0.05, max_delay_s=0.2)


def _quick(
    change: Callable[[Parts], Parts] | None = None, budget: RestartBudget = QUICK
) -> Callable[..., Parts]:
    def apply(deps: Parts) -> Parts:
        deps = change(deps) if change else deps
        return dataclasses.replace(deps, restart_budget=budget)

    return apply


async def _watched(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> tuple[RunningAgent, dict[str, KubeletEndpoint]]:
    """An agent wired as `gpuslice run` wires it; its endpoints, the latest by resource."""
    endpoints: dict[str, KubeletEndpoint] = {}
    running = await faults.start_with(
        _quick(recorded_endpoints(endpoints)), "t4x4", config=EXAMPLES / "time-slicing.yaml"
    )
    await running.registered(kubelet)
    return running, endpoints


async def test_a_server_that_dies_is_started_again_and_re_registered(
    kubelet: KubeletStandin, faults: FaultLauncher, logged: Logged
) -> None:
    running, endpoints = await _watched(kubelet, faults)
    server = endpoints[GPU].server
    await end_grpc_server(server)  # warm-up: every path runs once before the census
    await kubelet.wait_for(lambda k: registrations(k)[GPU] == 2 and serving(k, {GPU: 16}))
    before, times = Census.take(), []
    for n in range(3, 6):
        started = time.monotonic()
        await end_grpc_server(server)
        await kubelet.wait_for(lambda k, n=n: registrations(k)[GPU] == n and serving(k, {GPU: 16}))
        times.append(time.monotonic() - started)
    print(f"gRPC server died -> serving and re-registered: {summary_ms(times)}")
    # Each restart waits out its backoff (failures 2, 3 and 4 here), even though
    # the dying server's deleted socket is seen at once.
    for failures, took in zip(range(2, 5), times, strict=True):
        assert took >= min(QUICK.first_delay_s * 2 ** (failures - 1), QUICK.max_delay_s)
    manager = running.plugin.manager
    assert manager.server_failures == 4
    assert [e["resource"] for e in logged if e["event"] == "plugin_serving"] == [GPU] * 5
    assert [e["failures"] for e in logged if e["event"] == "plugin_server_failed"] == [1, 2, 3, 4]
    assert manager.registered() == {GPU: True}
    assert kubelet.stale_streams == []
    await kubelet.admit("after", {"main": {GPU: 1}})
    await kubelet.release("after")
    await no_leaks(before)


async def test_a_server_that_keeps_dying_makes_the_agent_give_up_with_one_line(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    running, endpoints = await _watched(kubelet, faults)
    server = endpoints[GPU].server
    for n in range(2, 7):  # five failures: each one restarted
        await end_grpc_server(server)
        await kubelet.wait_for(lambda k, n=n: registrations(k)[GPU] == n)
    assert not running.task.done()

    await end_grpc_server(server)  # the sixth within the hour
    with pytest.raises(PluginServerFailed) as failed:
        await asyncio.wait_for(asyncio.shield(running.task), 5)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"the device-plugin server for {GPU} failed 6 times in a row")
    assert "at most 5 restarts, each within 3600s of the last" in message
    assert "stopped on its own" in message
    with pytest.raises(PluginServerFailed):
        await running.shutdown()
    assert not is_socket(running.socket("nvidia-gpu.sock"))
    await kubelet.wait_for(lambda k: k.endpoint(GPU) is None)


async def _blocked(kubelet: KubeletStandin, faults: FaultLauncher) -> tuple[RunningAgent, str]:
    """A registered agent whose socket path then holds a directory: start() cannot
    replace it (the deleted socket, or the next kubelet restart, makes the agent try)."""
    running = await faults.start_with(
        _quick(budget=SLOWER), "t4x4", config=EXAMPLES / "time-slicing.yaml"
    )
    await running.registered(kubelet)
    path = running.socket("nvidia-gpu.sock")
    _block_socket_path(path)
    return running, path


def _block_socket_path(path: str) -> None:
    """Put a directory where the server must bind: start() cannot replace it."""
    os.unlink(path)
    os.mkdir(path)


async def test_a_server_that_cannot_start_again_is_retried_until_it_can(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    running, path = await _blocked(kubelet, faults)
    await kubelet.restart()  # the agent re-creates its socket and cannot
    manager = running.plugin.manager
    await eventually(lambda: manager.server_failures >= 2, "two failed starts")
    assert manager.registered() == {GPU: False}

    os.rmdir(path)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}))
    assert is_socket(path)
    assert manager.registered() == {GPU: True}
    assert not running.task.done()


async def test_a_server_that_never_starts_again_makes_run_raise_naming_the_path(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    running, path = await _blocked(kubelet, faults)
    started = time.monotonic()
    await kubelet.restart()
    with pytest.raises(PluginServerFailed) as failed:
        await asyncio.wait_for(asyncio.shield(running.task), 5)
    print(f"server cannot start -> agent gives up in {time.monotonic() - started:.2f} s")
    assert f"cannot serve {GPU}: cannot replace {path}: Is a directory" in str(failed.value)
    assert running.plugin.manager.server_failures == 6
    with pytest.raises(PluginServerFailed):
        await running.shutdown()
    os.rmdir(path)


class _FakeEndpoint:
    """A served endpoint with no gRPC behind it: starts can be made to fail, and
    the server can be made to go down."""

    def __init__(self) -> None:
        self.starts = 0
        self.failing_starts = 0
        self._down = asyncio.Event()
        self._changed = asyncio.Condition()

    async def start(self) -> None:
        async with self._changed:
            self.starts += 1
            self._changed.notify_all()
        if self.failing_starts:
            self.failing_starts -= 1
            raise ServerError("cannot serve example.com/widget: bind failed")
        self._down = asyncio.Event()

    async def register(self) -> None:
        return None

    def current(self) -> bool:
        return not self._down.is_set()

    def socket_present(self) -> bool:
        return not self._down.is_set()

    def down(self) -> str | None:
        return "went down" if self._down.is_set() else None

    def release_socket(self) -> None:
        return None

    async def end_streams(self, timeout_s: float) -> bool:
        return True

    async def wait_dropped(self) -> None:
        await asyncio.Event().wait()  # the kubelet never drops it

    async def wait_down(self) -> str:
        down = self._down
        await down.wait()
        return "went down"

    async def stop(self) -> None:
        return None

    def crash(self) -> None:
        self._down.set()

    async def started(self, times: int) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self.starts >= times), 5)


class _Clock:
    """The manager's clock and sleep: time moves only when a test moves it, and each
    sleep records its delay and lets the loop run once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(0)


async def _managed(
    budget: RestartBudget = QUICK,
) -> tuple[PluginManager, _FakeEndpoint, _Clock]:
    endpoint, clock = _FakeEndpoint(), _Clock()

    def factory(handler: ResourceHandler) -> PluginEndpoint:
        return endpoint

    manager = PluginManager(factory, budget=budget, clock=clock, sleep=clock.sleep)
    await manager.apply([Resource(name="example.com/widget", devices=())], AllocateOptions(), None)
    await endpoint.started(1)
    return manager, endpoint, clock


async def test_failures_an_hour_apart_never_spend_the_budget() -> None:
    """upstream's rule: a failure more than window_s after the previous one starts
    the count again, so a server failing every 61 minutes is restarted for ever."""
    manager, endpoint, clock = await _managed()
    for n in range(2, 12):
        clock.now += 3601
        endpoint.crash()
        await endpoint.started(n)
    assert not manager.failed.is_set()
    assert manager.server_failures == 10
    await manager.stop()


async def test_a_sixth_failure_within_the_window_spends_the_budget() -> None:
    manager, endpoint, clock = await _managed()
    for n in range(2, 7):
        clock.now += 3599
        endpoint.crash()
        await endpoint.started(n)
    assert not manager.failed.is_set()
    clock.now += 3599
    endpoint.crash()
    await asyncio.wait_for(manager.failed.wait(), 5)
    assert manager.error is not None
    assert "failed 6 times in a row" in str(manager.error)
    await manager.stop()


async def test_failed_starts_count_and_back_off_doubling() -> None:
    budget = RestartBudget(max_restarts=3, first_delay_s=0.02, max_delay_s=1.0)
    endpoint, clock = _FakeEndpoint(), _Clock()
    endpoint.failing_starts = 3
    manager = PluginManager(lambda h: endpoint, budget=budget, clock=clock, sleep=clock.sleep)
    await manager.apply([Resource(name="example.com/widget", devices=())], AllocateOptions(), None)
    await endpoint.started(4)  # three failures, then it starts
    assert clock.slept == [0.02, 0.04, 0.08]
    await eventually(lambda: manager.registered() == {"example.com/widget": True}, "registered")
    assert not manager.failed.is_set()
    await manager.stop()


async def test_a_server_that_died_is_known_as_such_even_when_stop_comes_first(
    plugin_dir: str,
) -> None:
    """A dying gRPC server unlinks its socket before it has terminated, so the
    deleted-socket path may call stop() before the termination watch has run:
    stop() must still report the death (this reads grpc.aio's core state)."""
    handler = ResourceHandler(Resource(name=GPU, devices=()), AllocateOptions())
    server = DevicePluginServer(handler, plugin_dir)
    await server.start()
    await end_grpc_server(server)
    await server.stop()
    assert server.down() == f"the gRPC server for {GPU} stopped on its own"

    await server.start()
    assert server.down() is None
    await server.stop()
    assert server.down() is None  # stopped on purpose


async def test_a_directory_put_at_the_socket_path_is_neither_served_nor_removed(
    plugin_dir: str,
) -> None:
    """Even when the directory reuses the socket's inode number, the server knows
    the file is no longer its socket: stop() leaves it and start() says why."""
    handler = ResourceHandler(Resource(name=GPU, devices=()), AllocateOptions())
    server = DevicePluginServer(handler, plugin_dir)
    await server.start()
    _block_socket_path(server.socket_path)
    assert not server.socket_present()
    await server.stop()
    assert stat.S_ISDIR(os.lstat(server.socket_path).st_mode)
    with pytest.raises(ServerError, match="Is a directory"):
        await server.start()
    os.rmdir(server.socket_path)


class _BreakingWatch:
    """A directory watch that fails on demand, as a bug in it would."""

    def __init__(self) -> None:
        self.broken = asyncio.Event()

    @contextlib.asynccontextmanager
    async def __call__(
        self, path: str, names: Collection[str] | None
    ) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
        yield self._events()

    async def _events(self) -> AsyncIterator[tuple[str, str]]:
        await self.broken.wait()
        raise RuntimeError("watch broke")
        yield ("never", "created")  # an async generator that yields nothing


async def test_a_background_task_that_fails_stops_the_agent_with_one_line(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    """The kubelet watch dying would leave the agent deaf to kubelet restarts:
    rather than serve on unseen, run() stops everything and raises, so `gpuslice
    run` exits non-zero and Kubernetes restarts the pod."""
    watch = _BreakingWatch()
    running = await faults.start_with(
        lambda deps: dataclasses.replace(deps, watch=watch),
        "t4x4",
        config=EXAMPLES / "time-slicing.yaml",
    )
    await running.registered(kubelet)
    assert not running.task.done()

    watch.broken.set()
    with pytest.raises(AgentTaskFailed) as failed:
        await asyncio.wait_for(asyncio.shield(running.task), 5)
    message = str(failed.value)
    assert "\n" not in message
    assert (
        message
        == "internal task DevicePluginFrontEnd.run ended unexpectedly: RuntimeError('watch broke')"
    )
    with pytest.raises(AgentTaskFailed):
        await running.shutdown()
    assert not is_socket(running.socket("nvidia-gpu.sock"))
    await kubelet.wait_for(lambda k: k.endpoint(GPU) is None)
