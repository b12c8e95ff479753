"""The device-plugin server over a real unix socket, called as the kubelet calls it."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator

import grpc
import pytest
from kubelet_fakes import FakeHandler, exists, make_resource

from gpuslice.adapters.deviceplugin import DevicePluginServer, RegistrationError
from gpuslice.adapters.deviceplugin.api import pb, pb_grpc
from gpuslice.core.errors import InvalidRequest
from gpuslice.core.response import ContainerAllocation, DeviceSpec, Mount
from gpuslice.testing.kubelet import KubeletStandin

GPU = "nvidia.com/gpu"


@pytest.fixture
def handler() -> FakeHandler:
    return FakeHandler(make_resource(gpus=2, numa=(0, None)))


@pytest.fixture
async def server(handler: FakeHandler, plugin_dir: str) -> AsyncIterator[DevicePluginServer]:
    srv = DevicePluginServer(handler, plugin_dir)
    await srv.start()
    yield srv
    await srv.stop(0)


@pytest.fixture
async def stub(server: DevicePluginServer) -> AsyncIterator[pb_grpc.DevicePluginAsyncStub]:
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        yield pb_grpc.DevicePluginStub(channel)


def _allocate(*containers: list[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )


async def test_serves_on_the_resource_socket_name(server: DevicePluginServer) -> None:
    assert os.path.basename(server.socket_path) == "nvidia-gpu.sock"
    assert server.socket_present()


async def test_socket_name_can_be_given(handler: FakeHandler, plugin_dir: str) -> None:
    srv = DevicePluginServer(handler, plugin_dir, socket_name="gpu-x.sock")
    await srv.start()
    try:
        assert exists(os.path.join(plugin_dir, "gpu-x.sock"))
    finally:
        await srv.stop(0)


async def test_registration_shows_devices_with_health_and_numa(
    handler: FakeHandler, server: DevicePluginServer, plugin_dir: str
) -> None:
    async with KubeletStandin(plugin_dir) as kubelet:
        # The stand-in clears sockets at start, like a starting kubelet; serve again.
        await server.stop(0)
        await server.start()
        handler.set_healthy(handler.resource.devices[1].id, False)
        await server.register(kubelet.socket_path)
        await kubelet.wait_for(lambda k: k.node_status().capacity.get(GPU) == 2)
        first, second = (d.id for d in handler.resource.devices)
        devices = kubelet.devices(GPU)
        assert (devices[first].healthy, devices[first].numa_nodes) == (True, (0,))
        assert (devices[second].healthy, devices[second].numa_nodes) == (False, ())
        record = kubelet.registrations[-1]
        assert (record.accepted, record.version, record.endpoint) == (
            True,
            "v1beta1",
            "nvidia-gpu.sock",
        )
        assert record.options is not None
        assert record.options.get_preferred_allocation_available
        assert not record.options.pre_start_required


async def test_options_announce_preferred_allocation_only(
    stub: pb_grpc.DevicePluginAsyncStub,
) -> None:
    opts = await stub.GetDevicePluginOptions(pb.Empty())
    assert opts.get_preferred_allocation_available
    assert not opts.pre_start_required


async def test_list_and_watch_sends_the_full_list_again_on_each_change(
    handler: FakeHandler, stub: pb_grpc.DevicePluginAsyncStub
) -> None:
    call = stub.ListAndWatch(pb.Empty())
    first = await call.read()
    assert isinstance(first, pb.ListAndWatchResponse)
    assert [(d.ID, d.health) for d in first.devices] == [
        (d.id, "Healthy") for d in handler.resource.devices
    ]
    assert [n.ID for n in first.devices[0].topology.nodes] == [0]
    assert not first.devices[1].HasField("topology")
    sick = handler.resource.devices[0].id
    handler.set_healthy(sick, False)
    second = await call.read()
    assert isinstance(second, pb.ListAndWatchResponse)
    assert {d.ID: d.health for d in second.devices} == {
        sick: "Unhealthy",
        handler.resource.devices[1].id: "Healthy",
    }
    handler.set_healthy(sick, True)
    third = await call.read()
    assert isinstance(third, pb.ListAndWatchResponse)
    assert {d.health for d in third.devices} == {"Healthy"}
    call.cancel()


async def test_stop_ends_list_and_watch_streams_without_waiting_for_grace(
    server: DevicePluginServer, stub: pb_grpc.DevicePluginAsyncStub
) -> None:
    call = stub.ListAndWatch(pb.Empty())
    await call.read()
    async with asyncio.timeout(5):  # far below the 60 s grace
        await server.stop(60)
        assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    assert not exists(server.socket_path)


async def test_allocate_converts_every_field(plugin_dir: str) -> None:
    alloc = ContainerAllocation(
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-a", "CUDA_MPS_PIPE_DIRECTORY": "/mps/pipe"},
        mounts=(
            Mount("/mps/pipe", "/run/mps/pipe"),
            Mount("/dev/shm", "/run/mps/shm", read_only=True),
        ),
        device_specs=(DeviceSpec("/dev/nvidia0", "/host/dev/nvidia0", "rw"),),
        annotations={"cdi.k8s.io/gpuslice_x": "k8s.device-plugin.nvidia.com/gpu=GPU-a"},
        cdi_devices=("k8s.device-plugin.nvidia.com/gpu=GPU-a", "vendor.com/x=all"),
    )
    handler = FakeHandler(make_resource(gpus=1), allocation=alloc)
    srv = DevicePluginServer(handler, plugin_dir)
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{srv.socket_path}") as channel:
            resp = await pb_grpc.DevicePluginStub(channel).Allocate(
                _allocate([handler.resource.devices[0].id])
            )
    finally:
        await srv.stop(0)
    (ctr,) = resp.container_responses
    assert dict(ctr.envs) == alloc.envs
    assert [(m.container_path, m.host_path, m.read_only) for m in ctr.mounts] == [
        ("/mps/pipe", "/run/mps/pipe", False),
        ("/dev/shm", "/run/mps/shm", True),
    ]
    assert [(d.container_path, d.host_path, d.permissions) for d in ctr.devices] == [
        ("/dev/nvidia0", "/host/dev/nvidia0", "rw")
    ]
    assert dict(ctr.annotations) == alloc.annotations
    assert [c.name for c in ctr.cdi_devices] == list(alloc.cdi_devices)


async def test_allocate_answers_each_container_request_in_order(
    handler: FakeHandler, stub: pb_grpc.DevicePluginAsyncStub
) -> None:
    a, b = (d.id for d in handler.resource.devices)
    resp = await stub.Allocate(_allocate([b], [a, b]))
    assert handler.allocate_calls == [[b], [a, b]]
    assert [dict(r.envs)["NVIDIA_VISIBLE_DEVICES"] for r in resp.container_responses] == [
        b,
        f"{a},{b}",
    ]


async def test_preferred_allocation_is_asked_per_container(
    handler: FakeHandler, stub: pb_grpc.DevicePluginAsyncStub
) -> None:
    a, b = (d.id for d in handler.resource.devices)
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=[a, b], must_include_deviceIDs=[], allocation_size=1
            ),
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=[a, b], must_include_deviceIDs=[a], allocation_size=2
            ),
        ]
    )
    resp = await stub.GetPreferredAllocation(request)
    assert [list(r.deviceIDs) for r in resp.container_responses] == [[b], [a, b]]
    assert handler.preferred_calls == [([a, b], [], 1), ([a, b], [a], 2)]


async def test_invalid_request_becomes_invalid_argument_with_its_message(
    stub: pb_grpc.DevicePluginAsyncStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(_allocate(["GPU-nope"]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "invalid request: unknown device: GPU-nope"


async def test_preferred_allocation_invalid_request_is_invalid_argument(
    handler: FakeHandler, stub: pb_grpc.DevicePluginAsyncStub
) -> None:
    handler.fail_next = InvalidRequest("not enough available devices to satisfy allocation")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[pb.ContainerPreferredAllocationRequest(allocation_size=1)]
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not enough available devices" in (err.value.details() or "")


async def test_unexpected_exception_is_internal_and_the_server_keeps_serving(
    handler: FakeHandler, stub: pb_grpc.DevicePluginAsyncStub
) -> None:
    dev = handler.resource.devices[0].id
    handler.fail_next = KeyError("boom")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(_allocate([dev]))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details() == "Allocate for nvidia.com/gpu failed: KeyError: 'boom'"
    handler.fail_next = RuntimeError("again")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[pb.ContainerPreferredAllocationRequest(allocation_size=1)]
            )
        )
    assert err.value.code() == grpc.StatusCode.INTERNAL
    resp = await stub.Allocate(_allocate([dev]))
    assert dict(resp.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": dev}


async def test_prestart_container_answers_empty(stub: pb_grpc.DevicePluginAsyncStub) -> None:
    resp = await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["x"]))
    assert resp == pb.PreStartContainerResponse()


async def test_raw_allocate_bytes_on_the_kubelet_method_path(
    handler: FakeHandler, server: DevicePluginServer
) -> None:
    """A hand-encoded request on /v1beta1.DevicePlugin/Allocate reaches the handler."""
    dev = handler.resource.devices[0].id.encode()
    body = b"\x0a" + bytes([len(dev) + 2]) + b"\x0a" + bytes([len(dev)]) + dev
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/v1beta1.DevicePlugin/Allocate"
        )
        raw = await call(body)
    assert handler.allocate_calls == [[dev.decode()]]
    parsed = pb.AllocateResponse.FromString(raw)
    assert dict(parsed.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": dev.decode()}


async def test_start_replaces_a_stale_socket(handler: FakeHandler, plugin_dir: str) -> None:
    path = os.path.join(plugin_dir, "nvidia-gpu.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()
    srv = DevicePluginServer(handler, plugin_dir)
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            opts = await pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty())
        assert opts.get_preferred_allocation_available
    finally:
        await srv.stop(0)


async def test_register_without_a_kubelet_raises_registration_error(
    server: DevicePluginServer, plugin_dir: str
) -> None:
    with pytest.raises(RegistrationError) as err:
        await server.register(os.path.join(plugin_dir, "kubelet.sock"), timeout_s=0.3)
    assert err.value.code in {"DEADLINE_EXCEEDED", "UNAVAILABLE"}
    assert str(err.value).startswith("registering nvidia.com/gpu with the kubelet at ")


async def test_refused_registration_carries_the_kubelets_reason(plugin_dir: str) -> None:
    async with KubeletStandin(plugin_dir) as kubelet:
        srv = DevicePluginServer(FakeHandler(make_resource(name="gpu")), plugin_dir)
        await srv.start()
        try:
            with pytest.raises(RegistrationError) as err:
                await srv.register(kubelet.socket_path)
        finally:
            await srv.stop(0)
    assert err.value.code == "UNKNOWN"
    assert err.value.reason.startswith('the ResourceName "gpu" is invalid')
