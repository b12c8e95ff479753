"""Kubelet and socket faults, many times over: quick kubelet restarts in a row, a
restart right after each registration, restarts at every point of re-registering,
and our sockets deleted under us (also while the kubelet is away). Each ends with
every resource registered once with the kubelet serving now, no stale stream, and
no fd, thread or task left over. (A kubelet that is not there yet at start is
covered by test_agent_kubelet_restart.py.)"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from agent_harness import (
    EXAMPLES,
    GPU,
    RunningAgent,
    is_socket,
    registrations,
    serving,
    start_mig_mixed,
)
from faults_harness import Census, FaultLauncher, no_leaks, summary_ms

from gpuslice.adapters.deviceplugin.api import pb
from gpuslice.core.resources import socket_name
from gpuslice.testing.kubelet import KubeletStandin

SETTLE_WINDOW_S = 0.5  # a settled agent registers nothing more in this window


async def _settled(kubelet: KubeletStandin, running: RunningAgent) -> None:
    """Every resource streams its full healthy list, the agent counts each as
    registered, nothing more registers, and no stream was ever stale. (A Register
    call the kubelet got just before restarting may have been refused: it dialled
    a socket its restart had deleted. The agent registers again after it.)"""
    want = running.served
    await kubelet.wait_for(lambda k: serving(k, want))
    seen = len(kubelet.registrations)
    with pytest.raises(TimeoutError):
        await kubelet.wait_for(lambda k: len(k.registrations) > seen, SETTLE_WINDOW_S)
    assert serving(kubelet, want)
    assert all(running.plugin.manager.registered().values())
    last = {r.resource: r for r in kubelet.registrations}
    assert all(last[n].accepted for n in want), last
    assert kubelet.stale_streams == []
    for name in want:
        assert is_socket(running.socket(socket_name(name)))


async def test_twenty_kubelet_restarts_in_a_row_end_registered_with_nothing_leaked(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    running = await start_mig_mixed(kubelet, faults)
    await kubelet.restart()  # warm-up: every path runs once before the census
    await _settled(kubelet, running)
    before, registered = Census.take(), registrations(kubelet)

    started = time.monotonic()
    for _ in range(20):
        await kubelet.restart()
    await _settled(kubelet, running)
    print(f"20 kubelet restarts in a row -> settled in {time.monotonic() - started:.2f} s")
    assert all(registrations(kubelet)[n] > registered[n] for n in running.served)
    await kubelet.admit("after", {"main": dict.fromkeys(running.served, 1)})
    await kubelet.release("after")
    await no_leaks(before)


async def test_a_restart_right_after_each_registration_ends_registered(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    """The kubelet restarts the moment it accepted a Register call, before the
    agent's other resources (or even that one's stream) are through."""
    running = await start_mig_mixed(kubelet, faults)
    before = Census.take()
    for _ in range(10):
        seen = len(kubelet.registrations)
        await kubelet.restart()
        await kubelet.wait_for(lambda k, seen=seen: len(k.registrations) > seen)
    await _settled(kubelet, running)
    await no_leaks(before)


@pytest.mark.parametrize("delay_ms", [0, 1, 3, 10, 30])
async def test_a_second_restart_at_any_point_of_re_registering_ends_registered(
    kubelet: KubeletStandin, faults: FaultLauncher, delay_ms: int
) -> None:
    """A second restart `delay_ms` after the first: while sockets are being
    re-created, while Register calls are in flight, or once they are through."""
    running = await start_mig_mixed(kubelet, faults)
    for _ in range(3):
        await kubelet.restart()
        await asyncio.sleep(delay_ms / 1000)  # the fault's timing, not a wait for an event
        await kubelet.restart()
    await _settled(kubelet, running)


async def test_every_socket_deleted_at_once_is_re_created_and_re_registered_each_time(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    running = await start_mig_mixed(kubelet, faults)
    paths = [running.socket(socket_name(n)) for n in running.served]
    before, times = Census.take(), []
    for round_ in range(1, 6):
        registered = registrations(kubelet)
        started = time.monotonic()
        for path in paths:
            os.unlink(path)
        await kubelet.wait_for(
            lambda k, r=registered: (
                serving(k, running.served)
                and all(registrations(k)[n] == r[n] + 1 for n in running.served)
            )
        )
        times.append(time.monotonic() - started)
        assert all(is_socket(p) for p in paths), round_
    print(f"4 sockets deleted -> re-created and re-registered: {summary_ms(times)}")
    await _settled(kubelet, running)
    await no_leaks(before)


async def test_a_socket_deleted_while_the_kubelet_is_away_is_served_at_once_and_registered_later(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    running = await faults.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    await running.registered(kubelet)
    path = running.socket("nvidia-gpu.sock")
    await kubelet.stop()
    os.unlink(path)
    deadline = time.monotonic() + 5
    while not is_socket(path):  # no event says "the agent bound its socket again"
        assert time.monotonic() < deadline, "socket not re-created"
        await asyncio.sleep(0.01)
    assert running.plugin.manager.registered() == {"nvidia.com/gpu": False}

    await kubelet.start()
    await _settled(kubelet, running)


class _BusyKubelet(KubeletStandin):
    """A kubelet that holds Register calls until `gate` opens, as one busy with
    other work does. It then dials the endpoint, as the kubelet does."""

    def __init__(self, plugin_dir: str) -> None:
        super().__init__(plugin_dir)
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = 0

    async def _register(self, req: pb.RegisterRequest) -> str | None:
        self.held += 1
        await self._notify()
        await self.gate.wait()
        return await super()._register(req)


async def test_a_socket_deleted_while_its_register_call_is_in_flight_is_registered_anew_at_once(
    plugin_dir: str, faults: FaultLauncher
) -> None:
    """The kubelet dials our socket while it handles Register; deleted meanwhile,
    that dial can only time out. The agent must not wait for that: it abandons the
    call, binds a new socket and registers again."""
    async with _BusyKubelet(plugin_dir) as kubelet:
        running = await faults.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
        await running.registered(kubelet)
        path = running.socket(socket_name(GPU))
        kubelet.gate.clear()
        held = kubelet.held
        os.unlink(path)  # the agent re-creates it and calls Register, held by the kubelet
        await kubelet.wait_for(lambda k: k.held > held)
        started = time.monotonic()
        os.unlink(path)  # deleted again while that call is in flight
        await kubelet.wait_for(lambda k: k.held > held + 1)
        kubelet.gate.set()
        await kubelet.wait_for(lambda k: serving(k, running.served))
        elapsed = time.monotonic() - started
        print(f"socket deleted during Register -> registered anew in {elapsed * 1000:.0f} ms")
        assert elapsed < 1.0  # a dial of the deleted socket would have taken 5 s
        assert is_socket(path)
        assert running.plugin.manager.registered() == {GPU: True}
        await running.shutdown()
