"""The kubelet stand-in behaves like the kubelet's device manager: registration and admission."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from kubelet_fakes import FakeHandler, make_resource, read_json

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.deviceplugin.api import pb, pb_grpc
from gpuslice.testing.kubelet import (
    AdmissionError,
    InsufficientResourceError,
    KubeletStandin,
    StandinError,
    is_extended_resource_name,
)

GPU = "nvidia.com/gpu"


@pytest.fixture
def handler() -> FakeHandler:
    return FakeHandler(make_resource(gpus=3, replicas=1, numa=(0, 0, 1)))


@pytest.fixture
async def plugin(
    kubelet: KubeletStandin, handler: FakeHandler, plugin_dir: str
) -> AsyncIterator[DevicePluginServer]:
    srv = DevicePluginServer(handler, plugin_dir)
    await srv.start()
    await srv.register(kubelet.socket_path)
    await kubelet.wait_for(lambda k: k.node_status().allocatable.get(GPU) == 3)
    yield srv
    await srv.stop(0)


async def _register(kubelet: KubeletStandin, request: pb.RegisterRequest) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.RegistrationStub(channel).Register(request)
    return err.value


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/mig-1g.5gb", True),
        ("example.com/a_b-c.d", True),
        ("gpu", False),  # no domain: a native resource
        ("kubernetes.io/gpu", False),
        ("foo.kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("Nvidia.com/gpu", False),  # prefix must be a lowercase DNS subdomain
        ("nvidia.com/", False),
        ("nvidia.com/-gpu", False),
        ("nvidia.com/gpu/x", False),
        ("nvidia.com/" + "g" * 63, True),
        ("nvidia.com/" + "g" * 64, False),
    ],
)
def test_extended_resource_name_rules(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


async def test_invalid_resource_name_is_refused_and_logged(kubelet: KubeletStandin) -> None:
    err = await _register(
        kubelet, pb.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name="gpu")
    )
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert (err.details() or "").startswith('the ResourceName "gpu" is invalid')
    (record,) = kubelet.registrations
    assert (record.resource, record.accepted) == ("gpu", False)
    assert kubelet.node_status().capacity == {}


async def test_unsupported_version_is_refused(kubelet: KubeletStandin) -> None:
    err = await _register(
        kubelet,
        pb.RegisterRequest(version="v1alpha", endpoint="x.sock", resource_name=GPU),
    )
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert 'requested API version "v1alpha" is not supported' in (err.details() or "")


async def test_unreachable_endpoint_is_refused_after_the_dial_timeout(plugin_dir: str) -> None:
    """The kubelet's dial blocks until the socket accepts: a missing one holds the
    Register call for the whole dial timeout before it is refused."""
    async with KubeletStandin(plugin_dir, dial_timeout_s=0.3) as kubelet:
        started = time.monotonic()
        err = await _register(
            kubelet,
            pb.RegisterRequest(version="v1beta1", endpoint="absent.sock", resource_name=GPU),
        )
        assert time.monotonic() - started >= 0.3
    assert "failed to dial device plugin: context deadline exceeded" in (err.details() or "")
    assert kubelet.endpoint(GPU) is None


async def test_registration_log_has_monotonic_times(
    kubelet: KubeletStandin, plugin: DevicePluginServer
) -> None:
    before = time.monotonic()
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for(lambda k: len(k.registrations) == 2)
    first, second = kubelet.registrations
    assert first.at <= second.at
    assert before <= second.at <= time.monotonic()
    assert kubelet.endpoint(GPU) == "nvidia-gpu.sock"


async def test_unhealthy_devices_reduce_allocatable_not_capacity(
    kubelet: KubeletStandin, handler: FakeHandler, plugin: DevicePluginServer
) -> None:
    handler.set_healthy(handler.resource.devices[2].id, False)
    await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 2)
    assert kubelet.node_status().capacity[GPU] == 3


async def test_admission_asks_for_a_preference_then_allocates_it(
    kubelet: KubeletStandin, handler: FakeHandler, plugin: DevicePluginServer
) -> None:
    a, b, c = (d.id for d in handler.resource.devices)
    (admitted,) = await kubelet.admit("pod-1", {"main": {GPU: 2}})
    assert handler.preferred_calls == [(sorted([a, b, c]), [], 2)]
    # The fake prefers the last available devices; the stand-in honours that.
    expected = tuple(sorted([a, b, c])[::-1][:2])
    assert admitted.device_ids == expected
    assert handler.allocate_calls == [list(expected)]
    assert admitted.allocation.envs == {"NVIDIA_VISIBLE_DEVICES": ",".join(expected)}
    assert kubelet.allocations() == {"pod-1": {"main": {GPU: expected}}}
    assert kubelet.node_status().allocated == {GPU: 2}


async def test_each_container_gets_its_own_allocate_call_and_devices(
    kubelet: KubeletStandin, handler: FakeHandler, plugin: DevicePluginServer
) -> None:
    admitted = await kubelet.admit("pod-1", {"a": {GPU: 1}, "b": {GPU: 2}})
    assert [len(x.device_ids) for x in admitted] == [1, 2]
    assert len(handler.allocate_calls) == 2
    assert set(admitted[0].device_ids).isdisjoint(admitted[1].device_ids)


async def test_later_pods_only_get_free_devices(
    kubelet: KubeletStandin, handler: FakeHandler, plugin: DevicePluginServer
) -> None:
    (first,) = await kubelet.admit("pod-1", {"main": {GPU: 2}})
    (second,) = await kubelet.admit("pod-2", {"main": {GPU: 1}})
    assert set(second.device_ids).isdisjoint(first.device_ids)
    with pytest.raises(AdmissionError) as err:
        await kubelet.admit("pod-3", {"main": {GPU: 1}})
    assert "Requested: 1, Available: 0" in err.value.message
    await kubelet.release("pod-1")
    (third,) = await kubelet.admit("pod-3", {"main": {GPU: 2}})
    assert set(third.device_ids) == set(first.device_ids)


async def test_more_than_capacity_is_insufficient(
    kubelet: KubeletStandin, plugin: DevicePluginServer
) -> None:
    with pytest.raises(InsufficientResourceError, match=r"Insufficient nvidia\.com/gpu$"):
        await kubelet.admit("big", {"a": {GPU: 2}, "b": {GPU: 2}})
    with pytest.raises(InsufficientResourceError, match=r"Insufficient example\.com/other$"):
        await kubelet.admit("other", {"a": {"example.com/other": 1}})
    assert kubelet.allocations() == {}


async def test_plugin_error_fails_admission_with_its_code(
    kubelet: KubeletStandin, handler: FakeHandler, plugin: DevicePluginServer
) -> None:
    handler.fail_next = RuntimeError("driver fell over")
    with pytest.raises(AdmissionError) as err:
        await kubelet.admit("pod-1", {"main": {GPU: 1}})
    assert err.value.code == "INTERNAL"
    assert err.value.reason == "UnexpectedAdmissionError"
    assert err.value.message.startswith("GetPreferredAllocation failed due to rpc error")
    assert kubelet.allocations() == {}
    (ok,) = await kubelet.admit("pod-1", {"main": {GPU: 1}})
    assert len(ok.device_ids) == 1


async def test_no_healthy_devices_fails_admission(
    kubelet: KubeletStandin, handler: FakeHandler, plugin: DevicePluginServer
) -> None:
    for dev in handler.resource.devices:
        handler.set_healthy(dev.id, False)
    await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 0)
    with pytest.raises(AdmissionError, match="no healthy devices present"):
        await kubelet.admit("pod-1", {"main": {GPU: 1}})


async def test_raw_helpers_reach_the_plugin(
    kubelet: KubeletStandin, handler: FakeHandler, plugin: DevicePluginServer
) -> None:
    a, b, _ = (d.id for d in handler.resource.devices)
    assert await kubelet.preferred_allocation(GPU, [a, b], [a], 2) == [a, b]
    allocs = await kubelet.allocate(GPU, [[a], [b]])
    assert [x.envs["NVIDIA_VISIBLE_DEVICES"] for x in allocs] == [a, b]
    with pytest.raises(AdmissionError) as err:
        await kubelet.allocate(GPU, [["GPU-unknown"]])
    assert err.value.code == "INVALID_ARGUMENT"
    stub = kubelet.plugin_stub(GPU)
    opts = await stub.GetDevicePluginOptions(pb.Empty())
    assert opts.get_preferred_allocation_available
    with pytest.raises(StandinError):
        kubelet.plugin_stub("example.com/none")


async def test_admissions_are_checkpointed_in_the_plugin_dir(
    kubelet: KubeletStandin, plugin: DevicePluginServer, plugin_dir: str
) -> None:
    (admitted,) = await kubelet.admit("pod-1", {"main": {GPU: 1}})
    saved = read_json(os.path.join(plugin_dir, "kubelet_internal_checkpoint"))
    (entry,) = saved["Data"]["PodDeviceEntries"]  # the kubelet's own layout
    assert entry["PodUID"] == admitted.pod_uid == kubelet.pod_uid("pod-1")
    assert (entry["ContainerName"], entry["ResourceName"]) == ("main", GPU)
    assert entry["DeviceIDs"] == {"-1": list(admitted.device_ids)}
    assert list(saved["Data"]["RegisteredDevices"]) == [GPU]
    with pytest.raises(StandinError, match="already admitted"):
        await kubelet.admit("pod-1", {"main": {GPU: 1}})


async def test_node_status_reads_like_kubectl_describe_node(
    kubelet: KubeletStandin, handler: FakeHandler, plugin: DevicePluginServer
) -> None:
    (admitted,) = await kubelet.admit("pod-1", {"main": {GPU: 1}})
    sick = next(d.id for d in handler.resource.devices if d.id not in admitted.device_ids)
    handler.set_healthy(sick, False)
    await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 2)
    status = kubelet.node_status()
    assert (status.capacity, status.allocatable) == ({GPU: 3}, {GPU: 2})
    assert (status.allocated, status.free) == ({GPU: 1}, {GPU: 1})
    assert str(status).startswith(
        "Capacity:\n  nvidia.com/gpu:  3\nAllocatable:\n  nvidia.com/gpu:  2\n"
    )


async def test_wait_for_times_out_naming_the_node_status(kubelet: KubeletStandin) -> None:
    with pytest.raises(TimeoutError, match=r"not met within 0\.05s; node status: NodeStatus"):
        await kubelet.wait_for(lambda k: k.endpoint(GPU) is not None, timeout_s=0.05)


class _SilentPlugin(pb_grpc.DevicePluginServicer):
    """A plugin that registers but sends its first list only once `release` is set;
    it allocates whatever it is asked, once `answer` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.allocating = asyncio.Event()  # set while an Allocate call is in
        self.answer = asyncio.Event()  # Allocate answers once this is set
        self.answer.set()

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: object
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()

    async def Allocate(self, request: pb.AllocateRequest, context: object) -> pb.AllocateResponse:
        self.allocating.set()
        await self.answer.wait()
        answers = [pb.ContainerAllocateResponse() for _ in request.container_requests]
        return pb.AllocateResponse(container_responses=answers)

    async def ListAndWatch(
        self, request: pb.Empty, context: object
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        await self.release.wait()
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="only", health="Healthy")])
        await asyncio.Event().wait()


@pytest.fixture
async def silent(kubelet: KubeletStandin, plugin_dir: str) -> AsyncIterator[_SilentPlugin]:
    """A _SilentPlugin registered for GPU (after `plugin`, when a test asks for both)."""
    silent = _SilentPlugin()
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(silent, server)
    path = os.path.join(plugin_dir, "silent.sock")
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        request = pb.RegisterRequest(version="v1beta1", endpoint="silent.sock", resource_name=GPU)
        async with grpc.aio.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(request)
        yield silent
    finally:
        await server.stop(None)


async def test_a_new_registration_keeps_capacity_until_its_first_list(
    kubelet: KubeletStandin, plugin: DevicePluginServer, silent: _SilentPlugin
) -> None:
    """As the kubelet keeps a resource's devices until the new client's first list, a
    registration never makes the node's capacity 0 (the scheduler would then refuse a
    pod as Insufficient, which no upgrade does on a real node)."""
    assert kubelet.endpoint(GPU) == "silent.sock"
    status = kubelet.node_status()
    assert (status.capacity[GPU], status.allocatable[GPU]) == (3, 3)  # the old list
    await kubelet.admit("during", {"main": {GPU: 1}})  # not Insufficient
    silent.release.set()
    await kubelet.wait_for(lambda k: k.node_status().capacity[GPU] == 1)


async def test_an_allocate_cut_short_by_a_dropped_client_fails_admission(
    kubelet: KubeletStandin, plugin: DevicePluginServer, silent: _SilentPlugin
) -> None:
    """The kubelet dropping a client (a restart here) while its Allocate is in flight
    fails that pod's admission, as the kubelet's closed connection does; the caller
    sees an AdmissionError, never a CancelledError it did not ask for."""
    silent.answer.clear()
    admitting = asyncio.create_task(kubelet.admit("cut", {"main": {GPU: 1}}))
    await silent.allocating.wait()
    await kubelet.restart()
    with pytest.raises(AdmissionError, match="code = Canceled") as failed:
        await admitting
    assert failed.value.code == "CANCELLED"
