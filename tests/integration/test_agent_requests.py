"""Requests the kubelet sends at admission: the failRequestsGreaterThanOne check,
GetPreferredAllocation per policy, and malformed requests on the raw stub."""

from __future__ import annotations

import grpc
import pytest
from agent_harness import EXAMPLES, GPU, AgentLauncher, RunningAgent, gpus_of

from gpuslice.adapters.deviceplugin.api import pb
from gpuslice.testing.kubelet import AdmissionError, KubeletStandin

SHARED = "nvidia.com/gpu.shared"


async def test_a_container_asking_for_two_shared_replicas_is_refused_with_advice(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing-renamed.yaml")
    await running.registered(kubelet)
    with pytest.raises(AdmissionError) as refused:
        await kubelet.admit("greedy", {"main": {SHARED: 2}})
    err = refused.value
    assert err.code == "INVALID_ARGUMENT"
    assert "\n" not in err.message
    assert "maximum request size for shared resources is 1; found 2" in err.message
    assert f"Request 1 {SHARED} per container" in err.message
    assert "sharing.timeSlicing.failRequestsGreaterThanOne: false" in err.message
    assert kubelet.allocations() == {}
    assert kubelet.node_status().free == {SHARED: 16}


async def test_two_containers_with_one_shared_replica_each_are_admitted(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing-renamed.yaml")
    await running.registered(kubelet)
    first, second = await kubelet.admit("pair", {"a": {SHARED: 1}, "b": {SHARED: 1}})
    assert len(first.device_ids) == len(second.device_ids) == 1
    assert gpus_of(first.device_ids) != gpus_of(second.device_ids)  # distributed
    assert kubelet.node_status().allocated == {SHARED: 2}


async def _t4x4_replicas(
    kubelet: KubeletStandin, launcher: AgentLauncher, flags: dict[str, str] | None = None
) -> tuple[RunningAgent, list[str]]:
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml", flags=flags)
    await running.registered(kubelet)
    return running, sorted(kubelet.devices(GPU))


async def test_distributed_spreads_a_two_replica_request_over_two_gpus(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    _, available = await _t4x4_replicas(kubelet, launcher)
    preferred = await kubelet.preferred_allocation(GPU, available, [], 2)
    assert len(preferred) == 2
    assert len(gpus_of(preferred)) == 2
    (admitted,) = await kubelet.admit("spread", {"main": {GPU: 2}})
    assert len(admitted.allocation.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2


async def test_packed_keeps_a_two_replica_request_on_one_gpu(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    _, available = await _t4x4_replicas(
        kubelet, launcher, {"shared-devices-allocation-policy": "packed"}
    )
    preferred = await kubelet.preferred_allocation(GPU, available, [], 2)
    assert len(preferred) == 2
    assert len(gpus_of(preferred)) == 1
    (admitted,) = await kubelet.admit("packed", {"main": {GPU: 2}})
    assert admitted.allocation.envs["NVIDIA_VISIBLE_DEVICES"] == gpus_of(preferred).pop()
    (next_pod,) = await kubelet.admit("packed-2", {"main": {GPU: 1}})
    assert gpus_of(next_pod.device_ids) == gpus_of(admitted.device_ids)  # fills that GPU first


def _preferred(available: list[str], must: list[str], size: int) -> pb.PreferredAllocationRequest:
    return pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


async def test_malformed_requests_get_invalid_argument_and_the_agent_keeps_serving(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running, available = await _t4x4_replicas(kubelet, launcher)
    stub = kubelet.plugin_stub(GPU)
    bad = {
        "unknown id": _preferred([*available[:3], "GPU-nope::0"], [], 2),
        "duplicate id": _preferred([available[0], available[0], available[1]], [], 2),
        "must-include not available": _preferred(available[1:4], [available[0]], 2),
        "size 0": _preferred(available, [], 0),
        "too few available": _preferred(available[:1], [], 2),
    }
    for what, request in bad.items():
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.GetPreferredAllocation(request, timeout=5)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert failed.value.details(), what
    allocate_bad = {
        "unknown id": ["GPU-nope::0"],
        "duplicate id": [available[0], available[0]],
        "empty": [],
    }
    for what, ids in allocate_bad.items():
        container = pb.ContainerAllocateRequest(devices_ids=ids)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Allocate(pb.AllocateRequest(container_requests=[container]), timeout=5)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what

    assert not running.task.done()
    assert kubelet.endpoint(GPU) == "nvidia-gpu.sock"
    (admitted,) = await kubelet.admit("after", {"main": {GPU: 1}})
    assert admitted.allocation.envs["NVIDIA_VISIBLE_DEVICES"] == gpus_of(admitted.device_ids).pop()
    assert [r.resource for r in kubelet.registrations] == [GPU]  # no re-registration needed
