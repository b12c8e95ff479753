"""Registering a device-plugin endpoint with the kubelet."""

from __future__ import annotations

import grpc
import structlog

from gpuslice.adapters.deviceplugin.api import API_VERSION, pb, pb_grpc, unix_target
from gpuslice.core.errors import GpusliceError

_log = structlog.get_logger()


class RegistrationError(GpusliceError):
    """The kubelet refused the registration or could not be reached.

    `code` is the gRPC status name ("UNAVAILABLE", "DEADLINE_EXCEEDED", ...) and
    `reason` the kubelet's (or the transport's) own words.
    """

    def __init__(self, resource: str, kubelet_socket: str, code: str, reason: str) -> None:
        super().__init__(
            f"registering {resource} with the kubelet at {kubelet_socket} failed: {code}: {reason}"
        )
        self.resource = resource
        self.code = code
        self.reason = reason


async def register(
    kubelet_socket: str,
    *,
    endpoint: str,
    resource_name: str,
    timeout_s: float = 5.0,
    preferred_allocation: bool = True,
) -> None:
    """Call Registration.Register; waits up to `timeout_s` for the kubelet socket to answer."""
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(get_preferred_allocation_available=preferred_allocation),
    )
    async with grpc.aio.insecure_channel(unix_target(kubelet_socket)) as channel:
        stub = pb_grpc.RegistrationStub(channel)
        try:
            await stub.Register(request, timeout=timeout_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(
                resource_name, kubelet_socket, exc.code().name, exc.details() or ""
            ) from None
    _log.info("registered", resource=resource_name, endpoint=endpoint, kubelet=kubelet_socket)
