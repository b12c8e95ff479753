"""NVML failing: at start (failOnInitError true and false) and mid-run, through a
backend whose snapshot(), probe() and event wait start raising BackendError. The
agent keeps serving what it last saw, a reload keeps the old resources, a failing
probe keeps a device Unhealthy until it answers, and a failing event wait marks
every GPU until each answers a probe."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import pytest
from agent_harness import EXAMPLES, GPU, RunningAgent, gpus_of, registrations, serving
from conftest import Logged
from faults_harness import (
    Census,
    FaultLauncher,
    FlakyBackend,
    eventually,
    no_leaks,
    with_backend,
)

from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.core.errors import BackendError
from gpuslice.core.sharing import ResourceSettings
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.agent import Parts

FAST_RECOVERY = {"GPUSLICE_HEALTH_HOLDDOWN": "50ms", "GPUSLICE_HEALTH_MAX_FLAPS": "100"}


async def _flaky(
    kubelet: KubeletStandin, faults: FaultLauncher, env: dict[str, str] | None = None
) -> tuple[RunningAgent, FlakyBackend]:
    backend = FlakyBackend(load_spec("t4x4"), os.path.join(faults.plugin_dir, "events.jsonl"))
    running = await faults.start_with(
        with_backend(lambda: backend), "t4x4", config=EXAMPLES / "time-slicing.yaml", env=env
    )
    await running.registered(kubelet)
    return running, backend


def _unhealthy_gpus(kubelet: KubeletStandin) -> set[str]:
    return gpus_of(d.id for d in kubelet.devices(GPU).values() if not d.healthy)


async def test_a_failing_snapshot_keeps_the_resources_served_and_reload_keeps_them(
    kubelet: KubeletStandin, faults: FaultLauncher, logged: Logged
) -> None:
    running, backend = await _flaky(kubelet, faults)
    before = Census.take()
    backend.snapshot_fails.set()

    assert not await running.reload()
    (entry,) = [e for e in logged if e["event"] == "hardware_unreadable_keeping_last_good"]
    assert "nvmlDeviceGetCount failed" in entry["error"]
    unshared = dataclasses.replace(running.devices.settings, resources=ResourceSettings())
    with pytest.raises(BackendError):
        await running.agent.apply_settings(unshared)  # e.g. the config manager's new config
    assert running.served == {GPU: 16}
    assert serving(kubelet, {GPU: 16})
    assert registrations(kubelet) == {GPU: 1}
    (admitted,) = await kubelet.admit("while-nvml-fails", {"main": {GPU: 1}})
    assert len(admitted.device_ids) == 1

    backend.snapshot_fails.clear()
    await running.agent.apply_settings(unshared)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}))
    await no_leaks(before)


async def test_a_failing_probe_keeps_the_device_unhealthy_until_it_answers(
    kubelet: KubeletStandin, faults: FaultLauncher, logged: Logged
) -> None:
    running, backend = await _flaky(kubelet, faults, FAST_RECOVERY)
    bad = running.gpu_uuid(2)
    before = Census.take()
    backend.probe_fails.set()
    running.inject(gpu=2, xid=94)  # transient: re-probed after the hold-down
    await kubelet.wait_for(lambda k: _unhealthy_gpus(k) == {bad})
    await eventually(lambda: sum(ok is None for _, ok in backend.probes) >= 2, "2 failed probes")
    assert _unhealthy_gpus(kubelet) == {bad}
    assert any(e["event"] == "health_probe_failed" and e["device"] == bad for e in logged)
    await kubelet.admit("elsewhere", {"main": {GPU: 1}})

    backend.probe_fails.clear()
    started = time.monotonic()
    await kubelet.wait_for(lambda k: _unhealthy_gpus(k) == set())
    took = time.monotonic() - started
    print(f"probe answers again -> Healthy in {took * 1000:.0f} ms (hold-down 50 ms)")
    assert backend.probes[-1] == (bad, True)
    await kubelet.release("elsewhere")
    await no_leaks(before)


async def test_a_failing_event_wait_marks_every_gpu_until_each_answers_a_probe(
    kubelet: KubeletStandin, faults: FaultLauncher
) -> None:
    running, backend = await _flaky(kubelet, faults, FAST_RECOVERY)
    every = {running.gpu_uuid(i) for i in range(4)}
    before = Census.take()
    updates = kubelet.updates(GPU)
    backend.wait_fails.set()
    await kubelet.wait_for(lambda k: k.updates(GPU) > updates)
    assert _unhealthy_gpus(kubelet) == every  # no GPU can be vouched for
    await kubelet.wait_for(lambda k: _unhealthy_gpus(k) == set())
    assert {d for d, ok in backend.probes if ok} == every
    assert not running.task.done()
    await no_leaks(before)


def _failing_open() -> FlakyBackend:
    raise BackendError("NVML did not initialise (NVML Shared Library Not Found)")


def _no_nvml(deps: Parts) -> Parts:
    return dataclasses.replace(deps, open_backend=_failing_open)


async def test_nvml_init_failure_with_fail_on_init_error_stops_the_agent(
    faults: FaultLauncher, plugin_dir: str
) -> None:
    before = Census.take()
    running = await faults.start_with(_no_nvml, "t4x4", wait_ready=False)
    await asyncio.wait({running.task}, timeout=10)  # it stops on its own
    assert running.task.done()
    with pytest.raises(BackendError, match="NVML did not initialise"):
        await running.shutdown()
    await no_leaks(before)
    assert not running.agent.ready.is_set()
    assert not [n for n in os.listdir(plugin_dir) if n.endswith(".sock")]


async def test_nvml_init_failure_without_fail_on_init_error_waits_serving_nothing(
    kubelet: KubeletStandin, faults: FaultLauncher, plugin_dir: str, logged: Logged
) -> None:
    before = Census.take()
    running = await faults.start_with(
        _no_nvml, "t4x4", flags={"fail-on-init-error": "false"}, wait_ready=False
    )
    await eventually(
        lambda: any(e["event"] == "backend_unavailable_waiting" for e in logged), "waiting logged"
    )
    assert not running.task.done()
    assert not running.agent.ready.is_set()
    assert kubelet.registrations == []
    assert [n for n in os.listdir(plugin_dir) if n.endswith(".sock")] == ["kubelet.sock"]
    await running.shutdown()  # returns cleanly on stop
    await no_leaks(before)
