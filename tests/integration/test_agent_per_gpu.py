"""Per-GPU sharing through the whole agent and the kubelet stand-in (real gRPC): one
node serves whole and time-sliced GPUs under different names, a live change re-lists
only the resources whose devices changed, a contradictory selection keeps the last good
config, and a GPU moved while a pod holds it is held back until the pod ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import (
    EXAMPLES,
    GPU,
    AgentLauncher,
    RunningAgent,
    gpus_of,
    pod_resources_socket,
    serving,
    write_file,
)
from conftest import Logged
from process_harness import run_once

from gpuslice.testing.kubelet import AdmissionError, KubeletStandin

SHARED = "nvidia.com/gpu.shared"
SMALL = "nvidia.com/gpu.small"


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    """The stand-in, serving PodResources where the agents read it."""
    async with KubeletStandin(plugin_dir, pod_resources_socket(plugin_dir)) as standin:
        yield standin


def per_gpu(shared: str, replicas: int = 4, small: str = '["6", "7"]') -> str:
    return f"""version: v1
sharing:
  timeSlicing:
    resources:
    - {{name: nvidia.com/gpu, rename: {SHARED}, replicas: {replicas}, devices: {shared}}}
    - {{name: nvidia.com/gpu, rename: {SMALL}, replicas: 8, devices: {small}}}
"""


async def _start(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path, text: str
) -> RunningAgent:
    write_file(config, text)
    running = await launcher.start("dgx-a100", config=config)
    await running.registered(kubelet)
    return running


async def test_a_mixed_node_serves_whole_and_shared_gpus_under_their_names(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """GPUs 2-3 x4 as gpu.shared, 6-7 x8 as gpu.small, the rest whole as nvidia.com/gpu;
    a pod of each kind gets a device of the GPUs its resource names, never another."""
    running = await _start(kubelet, launcher, tmp_path / "c.yaml", per_gpu('["2", "3"]'))
    assert running.served == {GPU: 4, SHARED: 8, SMALL: 16}
    uuid = running.gpu_uuid
    assert gpus_of(kubelet.devices(GPU)) == {uuid(i) for i in (0, 1, 4, 5)}
    assert gpus_of(kubelet.devices(SHARED)) == {uuid(2), uuid(3)}
    assert gpus_of(kubelet.devices(SMALL)) == {uuid(6), uuid(7)}
    got = await kubelet.admit("p", {"c": {GPU: 2, SHARED: 1, SMALL: 1}})
    by_resource = {a.resource: gpus_of(a.device_ids) for a in got}
    assert by_resource[GPU] <= {uuid(i) for i in (0, 1, 4, 5)}
    assert by_resource[SHARED] <= {uuid(2), uuid(3)}
    assert by_resource[SMALL] <= {uuid(6), uuid(7)}


async def test_a_live_change_relists_only_the_resources_whose_devices_changed(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    config = tmp_path / "c.yaml"
    running = await _start(kubelet, launcher, config, per_gpu('["2", "3"]'))
    before = {name: kubelet.updates(name) for name in (GPU, SHARED, SMALL)}

    write_file(config, per_gpu('["2", "3"]', replicas=2))  # only gpu.shared changes
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4, SHARED: 4, SMALL: 16}))
    assert kubelet.updates(SHARED) == before[SHARED] + 1
    assert (kubelet.updates(GPU), kubelet.updates(SMALL)) == (before[GPU], before[SMALL])

    write_file(config, per_gpu('["2", "3", "4"]', replicas=2))  # GPU 4 moves from gpu
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 3, SHARED: 6, SMALL: 16}))
    assert kubelet.updates(SHARED) == before[SHARED] + 2
    assert kubelet.updates(GPU) == before[GPU] + 1
    assert kubelet.updates(SMALL) == before[SMALL]


async def test_a_gpu_claimed_twice_is_refused_and_the_last_good_layout_keeps_serving(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    config = tmp_path / "c.yaml"
    running = await _start(kubelet, launcher, config, per_gpu('["2", "3"]'))
    write_file(config, per_gpu('["2", "6"]'))
    assert not await running.reload()
    assert running.rejected is not None
    assert "sharing.timeSlicing.resources[1]: device 6 (" in running.rejected
    assert "already selected by sharing.timeSlicing.resources[0]" in running.rejected
    assert running.served == {GPU: 4, SHARED: 8, SMALL: 16}


def health(kubelet: KubeletStandin, resource: str, gpu: str) -> set[bool]:
    """The health of every device of `resource` on physical GPU `gpu`, as streamed."""
    return {d.healthy for i, d in kubelet.devices(resource).items() if gpus_of([i]) == {gpu}}


async def test_a_gpu_moved_while_allocated_is_held_until_its_pod_ends(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """The kubelet keeps "old"'s whole GPU under nvidia.com/gpu (PodResources and the
    checkpoint name it there). When that GPU moves into gpu.shared, its replicas are
    advertised Unhealthy, so no new pod lands on it while "old" runs; once "old" ends
    (and the next check runs) they come back healthy and can be allocated."""
    config = tmp_path / "c.yaml"
    running = await _start(kubelet, launcher, config, per_gpu('["1"]', small="[7]"))
    uuid = running.gpu_uuid
    old = await kubelet.admit("old", {"c": {GPU: 1}})
    (moved,) = gpus_of(old[0].device_ids)
    index = next(g.index for g in running.devices.snapshot.gpus if g.uuid == moved)

    lists = kubelet.updates(SHARED)
    write_file(config, per_gpu(f'["1", "{index}"]', small="[7]"))
    assert await running.reload()
    await kubelet.wait_for(lambda k: len(k.devices(SHARED)) == 8 and len(k.devices(GPU)) == 5)
    assert kubelet.updates(SHARED) == lists + 1
    assert kubelet.allocations()["old"]["c"] == {GPU: old[0].device_ids}
    assert health(kubelet, SHARED, moved) == {False}  # from its first list on
    assert health(kubelet, SHARED, uuid(1)) == {True}
    assert kubelet.node_status().allocatable[SHARED] == 4

    new = await kubelet.admit("new", {"c": {SHARED: 4}})  # every replica of GPU 1
    assert gpus_of(new[0].device_ids) == {uuid(1)}
    with pytest.raises(AdmissionError):
        await kubelet.admit("late", {"c": {SHARED: 1}})  # only the held GPU is left

    await kubelet.release("old")
    assert running.devices.holds is not None
    await running.devices.holds.check(running.devices.snapshot, running.devices.resources)
    await kubelet.wait_for(lambda k: health(k, SHARED, moved) == {True})
    late = await kubelet.admit("late", {"c": {SHARED: 1}})
    assert gpus_of(late[0].device_ids) == {moved}


async def test_a_config_moving_an_allocated_gpu_at_start_holds_it_from_the_first_list(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """An agent restarted with a config that moved a GPU still in use: the kubelet
    streams the new resource's first list with that GPU held, never healthy."""
    config = tmp_path / "c.yaml"
    first = await _start(kubelet, launcher, config, per_gpu('["1"]', small="[7]"))
    old = await kubelet.admit("old", {"c": {GPU: 1}})
    (moved,) = gpus_of(old[0].device_ids)
    index = next(g.index for g in first.devices.snapshot.gpus if g.uuid == moved)
    await first.shutdown()

    write_file(config, per_gpu(f'["1", "{index}"]', small="[7]"))
    second = await launcher.start("dgx-a100", config=config)
    await kubelet.wait_for(lambda k: len(k.devices(SHARED)) == 8)
    assert kubelet.updates(SHARED) == 1
    assert health(kubelet, SHARED, moved) == {False}
    assert second.devices.holds is not None
    assert second.devices.holds.held == {moved}


async def test_without_pod_resources_nothing_is_held_and_serving_goes_on(
    launcher: AgentLauncher, tmp_path: Path, logged: Logged
) -> None:
    """A stand-in without the PodResources API: the agent serves as before, says once
    that it cannot read it, and holds nothing."""
    async with KubeletStandin(launcher.plugin_dir) as plain:
        config = tmp_path / "c.yaml"
        running = await _start(plain, launcher, config, per_gpu('["1"]', small="[7]"))
        await plain.admit("old", {"c": {GPU: 1}})
        write_file(config, per_gpu('["0", "1"]', small="[7]"))
        assert await running.reload()
        await plain.wait_for(lambda k: serving(k, {GPU: 5, SHARED: 8, SMALL: 8}))
    assert running.devices.holds is not None
    assert running.devices.holds.held == frozenset()
    events = [e["event"] for e in logged]
    assert events.count("pod_resources_unavailable_keeping_holds") == 1


async def test_run_logs_a_warning_for_gpus_this_node_lacks(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path, logged: Logged
) -> None:
    """The example's GPUs 4-7 do not exist on a T4x4: served as far as they exist."""
    running = await launcher.start("t4x4", config=EXAMPLES / "per-gpu-sharing.yaml")
    await running.registered(kubelet)
    assert running.served == {GPU: 2, SHARED: 8}
    details = [e["detail"] for e in logged if e["event"] == "hardware_layout_warning"]
    assert details == [
        f'sharing.timeSlicing.resources[{at}].devices: "{i}" matches no nvidia.com/gpu here '
        "(this node has no such device); skipped"
        for at, i in ((0, 4), (0, 5), (1, 6), (1, 7))
    ]


def test_inspect_shows_which_resource_serves_each_gpu() -> None:
    example = str(EXAMPLES / "per-gpu-sharing.yaml")
    args = ("inspect", "--fake-hardware", "dgx-a100", "--config-file", example)
    report = json.loads(run_once(*args, "--output", "json").stdout)
    served = {g["index"]: g["servedAs"] for g in report["gpus"]}
    assert served[0] == [
        {"resource": GPU, "device": report["gpus"][0]["uuid"], "index": "0", "mig": False,
         "replicas": 1, "hardLimitBytes": None, "softLimitBytes": None}
    ]  # fmt: skip
    assert [s["resource"] for g in report["gpus"] for s in g["servedAs"]] == [GPU] * 2 + [
        SHARED
    ] * 4 + [SMALL] * 2
    table = run_once(*args).stdout.splitlines()
    row = "{}    NVIDIA A100-SXM4-40GB  none              {}"
    assert row.format(2, "nvidia.com/gpu.shared (4 replicas)") in table
    assert row.format(7, "nvidia.com/gpu.small (8 replicas)") in table
