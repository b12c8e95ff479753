"""A decoy registration: the kubelet left with no current client for a resource, so that
the old agent's streams can end with nothing done (adapters.deviceplugin.handover).

The kubelet (v1.26 on) makes a Register call's client the resource's current one before
it dials it, and removes the current client when the dial or the options call fails;
when a stream then ends and no client is current, nothing happens: no device turns
unhealthy and the endpoint in place (the old agent's) goes on serving. So the successor
registers each resource once with a socket of its own whose GetDevicePluginOptions
answers an error at once (a missing socket would hold the kubelet's dial for 10 s). The
kubelet refuses that Register call, as expected, and logs "Failed to connect to new
client" once per resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Collection
from typing import Any, NoReturn

import grpc
import structlog

from gpuslice.adapters.deviceplugin.api import pb, pb_grpc
from gpuslice.adapters.deviceplugin.registration import RegistrationError, register
from gpuslice.adapters.kubelet_socket import SERVER_OPTIONS, serve_renamed, unlink

_log = structlog.get_logger()

DECOY_SOCKET = "gpuslice.decoy.sock"
DECOY_DETAIL = "gpuslice hand-over decoy: not a device plugin"
REGISTER_S = 5.0


_Ctx = grpc.aio.ServicerContext[Any, Any]


class _Refusing(pb_grpc.DevicePluginServicer):
    """Every call refused at once with DECOY_DETAIL."""

    async def GetDevicePluginOptions(  # noqa: N802
        self, request: pb.Empty, context: _Ctx
    ) -> pb.DevicePluginOptions:
        return await _refuse(context)

    async def ListAndWatch(  # noqa: N802
        self, request: pb.Empty, context: _Ctx
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        yield await _refuse(context)

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: _Ctx
    ) -> pb.PreferredAllocationResponse:
        return await _refuse(context)

    async def Allocate(  # noqa: N802
        self, request: pb.AllocateRequest, context: _Ctx
    ) -> pb.AllocateResponse:
        return await _refuse(context)

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: _Ctx
    ) -> pb.PreStartContainerResponse:
        return await _refuse(context)


async def _refuse(context: _Ctx) -> NoReturn:
    await context.abort(grpc.StatusCode.UNAVAILABLE, DECOY_DETAIL)
    raise AssertionError("abort raises")


async def register_decoys(
    directory: str, kubelet_socket: str, resources: Collection[str], timeout_s: float = REGISTER_S
) -> bool:
    """Register the decoy for each of `resources`; True when the kubelet refused each
    one for the decoy's own answer (said in one line), False otherwise (each said)."""
    if not resources or not kubelet_socket:
        return False
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_DevicePluginServicer_to_server(_Refusing(), server)
    path = os.path.join(directory, DECOY_SOCKET)
    try:
        await serve_renamed(server, path)
    except (OSError, RuntimeError) as exc:
        _log.warning("decoy_not_served", socket=path, error=str(exc))
        return False
    try:
        outcomes = await asyncio.gather(
            *(_refused(kubelet_socket, name, timeout_s) for name in sorted(resources))
        )
    finally:
        await server.stop(None)
        with contextlib.suppress(OSError):
            unlink(path)
    if all(outcomes):
        _log.info(
            "decoy_refused_as_expected",
            resources=sorted(resources),
            detail="the kubelet has no current client for these resources now: the old "
            "agent's streams end with nothing done",
        )
    return all(outcomes)


async def _refused(kubelet_socket: str, resource: str, timeout_s: float) -> bool:
    try:
        await register(
            kubelet_socket, endpoint=DECOY_SOCKET, resource_name=resource, timeout_s=timeout_s
        )
    except RegistrationError as exc:
        if DECOY_DETAIL in exc.reason:
            return True
        _log.warning("decoy_failed", resource=resource, error=str(exc))
        return False
    _log.warning("decoy_accepted", resource=resource)  # no kubelet connects without options
    return False
