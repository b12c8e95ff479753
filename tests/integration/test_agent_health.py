"""Health events from the simulated backend's events file reach the kubelet:
every replica and MIG device of a failed GPU turns Unhealthy in every resource
that holds it, ignored XIDs change nothing, and recovery brings them back."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from agent_harness import EXAMPLES, GPU, AgentLauncher, RunningAgent, gpus_of
from faults_harness import Census, no_leaks

from gpuslice.testing.kubelet import AdmissionError, KubeletStandin

MIG_RESOURCES = ("nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb")


def _parent(running: RunningAgent) -> dict[str, str]:
    """Device (GPU or MIG) UUID -> the physical GPU that holds it."""
    gpus = running.devices.snapshot.gpus
    return {m.uuid: g.uuid for g in gpus for m in g.mig_devices} | {g.uuid: g.uuid for g in gpus}


def _only_unhealthy(
    kubelet: KubeletStandin, running: RunningAgent, expected: Mapping[str, set[str]]
) -> bool:
    """Every device of each resource is listed, and exactly those on `expected`
    GPUs are Unhealthy."""
    parent = _parent(running)
    for name, count in running.served.items():
        bad = expected.get(name, set())
        devices = kubelet.devices(name)
        if len(devices) != count:
            return False
        for device in devices.values():
            (physical,) = gpus_of([device.id])
            if device.healthy == (parent[physical] in bad):
                return False
    return True


async def test_a_transient_xid_marks_every_replica_of_that_gpu_and_recovery_restores_them(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    await running.registered(kubelet)
    bad = running.gpu_uuid(2)
    before = Census.take()

    running.inject(gpu=2, xid=94)  # contained ECC error: transient
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, {GPU: {bad}}))
    status = kubelet.node_status()
    assert (status.capacity[GPU], status.allocatable[GPU]) == (16, 12)

    admitted = [await kubelet.admit(f"pod-{i}", {"main": {GPU: 1}}) for i in range(12)]
    placed = {g for (a,) in admitted for g in gpus_of(a.device_ids)}
    assert bad not in placed
    assert len(placed) == 3
    with pytest.raises(AdmissionError, match="Available: 0"):
        await kubelet.admit("no-room", {"main": {GPU: 1}})

    await kubelet.restart()  # a kubelet restart forgets nothing the agent knows
    await kubelet.wait_for(lambda k: k.endpoint(GPU) is not None and k.updates(GPU) > 0)
    assert _only_unhealthy(kubelet, running, {GPU: {bad}})

    running.inject(gpu=2, recovered=True)
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, {}))
    assert kubelet.node_status().allocatable[GPU] == 16
    (late,) = await kubelet.admit("after-recovery", {"main": {GPU: 1}})
    assert gpus_of(late.device_ids) == {bad}
    await no_leaks(before)


async def test_a_fatal_xid_stays_unhealthy_after_a_recovered_event(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    """XID 79 (fallen off the bus) needs a GPU reset: "recovered" does not clear it,
    while a transient mark on another GPU is cleared by the same kind of event."""
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    await running.registered(kubelet)
    fatal, transient = running.gpu_uuid(1), running.gpu_uuid(3)
    running.inject(gpu=1, xid=79)
    running.inject(gpu=3, xid=94)
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, {GPU: {fatal, transient}}))
    running.inject(gpu=1, recovered=True)
    running.inject(gpu=3, recovered=True)
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, {GPU: {fatal}}))


async def test_an_ignored_xid_changes_nothing(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    """XID 13 (an application error) on GPU 0, then XID 79 on GPU 1: once GPU 1's
    replicas are Unhealthy the earlier event has been handled, and GPU 0 is fine."""
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    await running.registered(kubelet)
    updates = kubelet.updates(GPU)

    running.inject(gpu=0, xid=13)
    running.inject(gpu=1, xid=79)
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, {GPU: {running.gpu_uuid(1)}}))
    assert kubelet.updates(GPU) == updates + 1  # one new list: XID 13 sent nothing


async def test_xid_on_a_mig_gpu_marks_every_mig_device_of_it_in_every_resource(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    """a100-40gb-mig-mixed with the a100-40gb entry: GPU 0 holds every MIG device
    (time-sliced), GPU 1 the nvidia.com/gpu replicas."""
    running = await launcher.start(
        "a100-40gb-mig-mixed",
        config=EXAMPLES / "time-slicing-configmap.yaml",
        config_name="a100-40gb",
    )
    await running.registered(kubelet)
    mig_gpu, plain_gpu = running.gpu_uuid(0), running.gpu_uuid(1)
    before = Census.take()

    running.inject(gpu=0, xid=94)  # transient, so the recovered event below clears it
    on_mig_gpu = {name: {mig_gpu} for name in MIG_RESOURCES}
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, on_mig_gpu))
    assert kubelet.node_status().allocatable == {GPU: 8} | dict.fromkeys(MIG_RESOURCES, 0)
    for name in MIG_RESOURCES:
        with pytest.raises(AdmissionError, match="no healthy devices"):
            await kubelet.admit(f"wants-{name}", {"main": {name: 1}})
    await kubelet.admit("plain", {"main": {GPU: 1}})

    running.inject(gpu=1, xid=48)
    everything = on_mig_gpu | {GPU: {plain_gpu}}
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, everything))

    running.inject(gpu=0, recovered=True)
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, {GPU: {plain_gpu}}))
    assert kubelet.node_status().allocatable == {
        GPU: 0,
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 3,
    }
    await no_leaks(before)


@pytest.mark.parametrize("config", [None, "dgx-a100-demo.yaml"], ids=["whole", "replicas"])
@pytest.mark.parametrize("fault", [{"lost": True}, {"xid": 79}], ids=["lost", "xid79"])
async def test_a_gpu_off_the_bus_never_fails_admission_on_the_others(
    kubelet: KubeletStandin, launcher: AgentLauncher, fault: dict[str, object], config: str | None
) -> None:
    """dgx-a100 whole GPUs (NVLink-aware preferred allocation) or time-sliced:
    with GPU 3 gone, requests the other GPUs can serve are admitted through
    GetPreferredAllocation and Allocate, none gets GPU 3, and only a request
    larger than what is left fails."""
    running = await launcher.start("dgx-a100", config=config and EXAMPLES / config)
    await running.registered(kubelet)
    lost = running.gpu_uuid(3)
    total = running.served[GPU]
    per_gpu = total // 8
    running.inject(gpu=3, **fault)
    await kubelet.wait_for(lambda k: _only_unhealthy(k, running, {GPU: {lost}}))
    assert kubelet.node_status().allocatable[GPU] == total - per_gpu

    sizes = [2, 1, 4] if per_gpu == 1 else [2, 1, 4, 8, 3]
    placed: set[str] = set()
    for i, size in enumerate(sizes):
        (got,) = await kubelet.admit(f"pod-{i}", {"main": {GPU: size}})
        assert len(got.device_ids) == size
        placed |= gpus_of(got.device_ids)
    assert lost not in placed
    free = kubelet.node_status().free[GPU]
    assert free == total - per_gpu - sum(sizes)
    with pytest.raises(AdmissionError, match="Available"):
        await kubelet.admit("too-many", {"main": {GPU: free + 1}})
