"""Kubelet restarts, a deleted plugin socket and a kubelet that starts after the
agent: every resource ends up registered again, promptly and exactly, with no
stale ListAndWatch stream and with allocations kept."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from agent_harness import (
    EXAMPLES,
    GPU,
    AgentLauncher,
    gpus_of,
    is_socket,
    registrations,
    serving,
    start_mig_mixed,
)

from gpuslice.core.resources import socket_name
from gpuslice.core.restart import REGISTER_RETRY
from gpuslice.testing.kubelet import AdmissionError, KubeletStandin

RETRY_START_S = REGISTER_RETRY.first_s  # the first Register retry comes this long after

# After re-registering, a settled agent registers nothing more in this window.
SETTLE_WINDOW_S = 0.5


async def _assert_no_more_registrations(kubelet: KubeletStandin, seen: int) -> None:
    """A bounded check that nothing happens: the registration log stays put."""
    with pytest.raises(TimeoutError):
        await kubelet.wait_for(lambda k: len(k.registrations) > seen, SETTLE_WINDOW_S)


async def test_kubelet_restart_re_registers_every_resource_on_new_sockets(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await start_mig_mixed(kubelet, launcher)
    want = running.served
    before = registrations(kubelet)

    started = time.monotonic()
    await kubelet.restart()
    await kubelet.wait_for(
        lambda k: serving(k, want) and all(registrations(k)[n] > before[n] for n in want)
    )
    elapsed = time.monotonic() - started
    print(f"kubelet restart -> {len(want)} resources re-registered in {elapsed * 1000:.0f} ms")

    for name in want:
        path = running.socket(socket_name(name))
        assert is_socket(path)
    assert kubelet.stale_streams == []
    assert all(r.accepted for r in kubelet.registrations)
    await _assert_no_more_registrations(kubelet, len(kubelet.registrations))
    # Exactly one new registration each: a needless second one would drop the
    # resource again (stream ended, devices Unhealthy) just after it came back.
    assert registrations(kubelet) == {n: before[n] + 1 for n in want}
    assert kubelet.stale_streams == []
    assert serving(kubelet, want)


async def test_quick_restarts_in_a_row_end_with_every_resource_registered(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await start_mig_mixed(kubelet, launcher)
    want = running.served
    for _ in range(4):
        await kubelet.restart()
    await kubelet.wait_for(lambda k: serving(k, want))
    await _assert_no_more_registrations(kubelet, len(kubelet.registrations))
    assert serving(kubelet, want)
    assert kubelet.stale_streams == []
    for name in want:
        assert is_socket(running.socket(socket_name(name)))
    await kubelet.admit("after-restarts", {"main": dict.fromkeys(want, 1)})


async def test_kubelet_away_for_a_while_is_registered_with_once_it_is_back(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    """kubelet.sock is gone for longer than the first registration retry: the
    agent registers once, as soon as kubelet.sock is back."""
    running = await start_mig_mixed(kubelet, launcher)
    want = running.served
    before = registrations(kubelet)
    restart = asyncio.create_task(kubelet.restart(delay=2 * RETRY_START_S))
    await kubelet.wait_for(lambda k: not k.serving)
    await kubelet.wait_for(lambda k: k.serving, 5)
    back = time.monotonic()
    await restart
    await kubelet.wait_for(lambda k: serving(k, want))
    elapsed = time.monotonic() - back
    print(f"kubelet back after a pause -> re-registered in {elapsed * 1000:.0f} ms")
    assert elapsed < RETRY_START_S
    await _assert_no_more_registrations(kubelet, len(kubelet.registrations))
    assert registrations(kubelet) == {n: before[n] + 1 for n in want}
    assert kubelet.stale_streams == []


async def test_allocations_survive_a_kubelet_restart_and_new_pods_get_free_devices(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    await running.registered(kubelet)
    before = [await kubelet.admit(f"old-{i}", {"main": {GPU: 1}}) for i in range(3)]
    held = {d for (a,) in before for d in a.device_ids}

    await kubelet.restart()
    await running.registered(kubelet)
    assert {d for pod in kubelet.allocations().values() for d in pod["main"][GPU]} == held

    fresh = [await kubelet.admit(f"new-{i}", {"main": {GPU: 1}}) for i in range(16 - 3)]
    given = [d for (a,) in fresh for d in a.device_ids]
    assert len(set(given)) == len(given) == 13
    assert held.isdisjoint(given)
    with pytest.raises(AdmissionError, match="Available: 0"):
        await kubelet.admit("one-too-many", {"main": {GPU: 1}})


async def test_deleted_plugin_socket_is_served_again_and_re_registered(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    await running.registered(kubelet)
    path = running.socket("nvidia-gpu.sock")

    os.unlink(path)
    await kubelet.wait_for(lambda k: registrations(k)[GPU] == 2 and serving(k, {GPU: 16}))
    assert is_socket(path)
    await _assert_no_more_registrations(kubelet, len(kubelet.registrations))
    assert kubelet.stale_streams == []
    (admitted,) = await kubelet.admit("after", {"main": {GPU: 1}})
    assert gpus_of(admitted.device_ids) <= {g.uuid for g in running.devices.snapshot.gpus}


async def test_agent_started_before_the_kubelet_registers_as_soon_as_it_appears(
    plugin_dir: str, launcher: AgentLauncher
) -> None:
    """Only the directory exists when the agent starts. The agent serves at once
    (ready without a kubelet), and registers within moments of kubelet.sock
    appearing: driven by the directory watch, not by a retry timer."""
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    assert is_socket(running.socket("nvidia-gpu.sock"))
    assert running.plugin.manager.registered() == {GPU: False}

    async with KubeletStandin(plugin_dir) as kubelet:
        started = time.monotonic()
        await running.registered(kubelet)
        elapsed = time.monotonic() - started
        print(f"kubelet start -> registered in {elapsed * 1000:.0f} ms")
        assert elapsed < RETRY_START_S
        assert kubelet.stale_streams == []
        await kubelet.admit("first", {"main": {GPU: 1}})
