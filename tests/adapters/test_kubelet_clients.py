"""The kubelet stand-in keeps a resource's current client as the kubelet's device manager
does (v1.26 on): a Register call makes its client current before dialling it; a failed
dial or options call removes the current client and leaves the endpoint alone; a stream
that ends while no client is current changes nothing. With `register_after_connect` a
client becomes current only once connected. Over real unix sockets."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import grpc
import pytest
from kubelet_fakes import FakeHandler, make_resource

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.deviceplugin.api import pb, pb_grpc
from gpuslice.testing.kubelet import KubeletStandin

GPU = "nvidia.com/gpu"


@pytest.fixture
def after_connect() -> bool:
    """The stand-in's register_after_connect (a test parametrizes it)."""
    return False


@pytest.fixture
async def kubelet(plugin_dir: str, after_connect: bool) -> AsyncIterator[KubeletStandin]:
    async with KubeletStandin(
        plugin_dir, register_after_connect=after_connect, dial_timeout_s=0.2
    ) as standin:
        yield standin


class _Options(pb_grpc.DevicePluginServicer):
    """A plugin whose options call is refused."""

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.DevicePluginOptions:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "not this one")
        raise AssertionError("abort returns no answer")


@pytest.fixture
async def refusing(kubelet: KubeletStandin) -> AsyncIterator[_Options]:
    """A plugin on refusing.sock whose options call is refused."""
    options = _Options()
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(options, server)
    server.add_insecure_port(f"unix://{os.path.join(kubelet.plugin_dir, 'refusing.sock')}")
    await server.start()
    yield options
    await server.stop(None)


async def _serve(kubelet: KubeletStandin, handler: FakeHandler, name: str) -> DevicePluginServer:
    srv = DevicePluginServer(handler, kubelet.plugin_dir, name)
    await srv.start()
    await srv.register(kubelet.socket_path)
    await kubelet.wait_for(lambda k: k.endpoint(GPU) == name and k.updates(GPU) > 0)
    return srv


async def _register(kubelet: KubeletStandin, endpoint: str) -> str:
    """Register `endpoint` for GPU; the kubelet's error text ("" when accepted)."""
    request = pb.RegisterRequest(version="v1beta1", endpoint=endpoint, resource_name=GPU)
    async with grpc.aio.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
        try:
            await pb_grpc.RegistrationStub(channel).Register(request)
        except grpc.aio.AioRpcError as exc:
            return exc.details() or ""
    return ""


@pytest.mark.parametrize("after_connect", [False, True])
async def test_a_refused_options_call_leaves_no_current_client(
    kubelet: KubeletStandin, refusing: _Options, after_connect: bool
) -> None:
    """The options call fails: the Register call fails with the kubelet's words and the
    resource has no current client, so the old plugin's stream then ends with nothing
    done: devices healthy, its endpoint in place and still allocating on the connection
    left open. Registering only after connecting, the old one is still current and its
    end drops the resource."""
    handler = FakeHandler(make_resource())
    old = await _serve(kubelet, handler, "nvidia-gpu.sock")
    error = await _register(kubelet, "refusing.sock")
    assert error.startswith("failed to get device plugin options: rpc error: ")
    assert "code = Unavailable desc = not this one" in error
    hung_up = await old.end_streams(timeout_s=0.3)
    if after_connect:
        assert hung_up
        await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 0)
        assert [d.dropped for d in kubelet.disconnects] == ["nvidia-gpu.sock"]
    else:
        assert not hung_up
        await kubelet.wait_for(lambda k: k.endpoint(GPU) is None)  # its stream ended
        assert kubelet.disconnects == []
        assert kubelet.node_status().allocatable[GPU] == 2
        await kubelet.admit("pod", {"main": {GPU: 1}})
        assert len(handler.allocate_calls) == 1
    await old.stop(0)


async def test_a_failed_dial_leaves_no_current_client(kubelet: KubeletStandin) -> None:
    """A Register call naming a socket nobody serves is held for the dial timeout, then
    refused; the resource has no current client, and the old plugin's end changes
    nothing. A plugin registered next serves, and the old one then going is not seen."""
    old_handler, new_handler = FakeHandler(make_resource()), FakeHandler(make_resource())
    old = await _serve(kubelet, old_handler, "nvidia-gpu.sock")
    assert "failed to dial device plugin" in await _register(kubelet, "absent.sock")
    assert not await old.end_streams(timeout_s=0.3)
    await kubelet.admit("pod-0", {"main": {GPU: 1}})
    new = await _serve(kubelet, new_handler, "nvidia-gpu-2.sock")
    await old.stop(0)
    await kubelet.admit("pod-1", {"main": {GPU: 1}})
    assert (len(old_handler.allocate_calls), len(new_handler.allocate_calls)) == (1, 1)
    assert kubelet.disconnects == []
    assert kubelet.node_status().allocatable[GPU] == 2
    await new.stop(0)
