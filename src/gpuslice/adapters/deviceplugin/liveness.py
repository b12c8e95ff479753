"""Whether a live device plugin serves a unix socket, proven with its own API
(adapters.kubelet_socket.answers: a socket that accepts and says nothing, sends garbage,
or speaks another protocol is not one, and its file is ours to replace)."""

from __future__ import annotations

import grpc

from gpuslice.adapters.deviceplugin.api import pb, pb_grpc
from gpuslice.adapters.kubelet_socket import PROBE_S, answers

__all__ = ["PROBE_S", "serves_device_plugin"]


async def serves_device_plugin(path: str, timeout_s: float = PROBE_S) -> bool:
    """True when a device plugin answers GetDevicePluginOptions on `path`."""

    async def options(channel: grpc.aio.Channel, deadline_s: float) -> object:
        stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
        return await stub.GetDevicePluginOptions(pb.Empty(), timeout=deadline_s)

    return await answers(path, options, timeout_s)
