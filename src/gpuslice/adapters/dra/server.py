"""The DRA kubelet plugin's gRPC side: a registration socket in plugins_registry and the
service socket the kubelet calls, over a core DraHandler.

The registration socket (<registry>/<driver>-reg.sock) serves pluginregistration v1:
GetInfo names the driver, the service socket's absolute path and the services offered
there, in the kubelet's order of preference ("v1.DRAPlugin", "v1beta1.DRAPlugin",
"v1alpha1.DRAResourceHealth"); NotifyRegistrationStatus tells us the outcome. The
service socket (<plugins>/<driver>/dra.sock) serves DRAPlugin v1 and v1beta1 (the same
messages in two packages) and DRAResourceHealth, whose stream sends the complete device
list at once and after every change. Requests are capped as the device-plugin server's
are (adapters.kubelet_socket), and a request naming more than MAX_CLAIMS claims is
refused. A socket another live plugin serves (it answers GetInfo, or Prepare on the
service socket) is left alone; ours are bound and renamed into place as the device-plugin
server's are, so stopping never removes another process's socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from gpuslice.adapters.deviceplugin.servicer import clip
from gpuslice.adapters.fswatch import FileId, file_id
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2 as v1
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from gpuslice.adapters.kubelet._proto.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.adapters.kubelet._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpuslice.adapters.kubelet._proto.drahealth.v1alpha1 import api_pb2 as hpb
from gpuslice.adapters.kubelet._proto.drahealth.v1alpha1 import api_pb2_grpc as hpb_grpc
from gpuslice.adapters.kubelet._proto.pluginregistration.v1 import api_pb2 as reg
from gpuslice.adapters.kubelet._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from gpuslice.adapters.kubelet_socket import SERVER_OPTIONS, answers, serve_renamed, unlink
from gpuslice.core.dra.claims import ClaimRef
from gpuslice.core.errors import GpusliceError
from gpuslice.core.ports import DraHandler, SocketTaken
from gpuslice.core.waiting import first_of

_log = structlog.get_logger()
_Ctx = grpc.aio.ServicerContext[Any, Any]

PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
SERVICE_SOCKET = "dra.sock"
MAX_CLAIMS = 1024


def registration_socket(registry_dir: str, driver: str) -> str:
    return os.path.join(registry_dir, f"{driver}-reg.sock")


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, owner: DraServer) -> None:
        self._info = reg.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=endpoint, supported_versions=SERVICES
        )
        self._owner = owner

    async def GetInfo(self, request: reg.InfoRequest, context: _Ctx) -> reg.PluginInfo:  # noqa: N802
        return self._info

    async def NotifyRegistrationStatus(  # noqa: N802
        self, request: reg.RegistrationStatus, context: _Ctx
    ) -> reg.RegistrationStatusResponse:
        await self._owner._registration_status(request.plugin_registered, clip(request.error))
        return reg.RegistrationStatusResponse()


class _Plugin:
    """NodePrepareResources and NodeUnprepareResources for one package's messages."""

    def __init__(self, handler: DraHandler, pb: Any) -> None:
        self._handler = handler
        self._pb = pb

    async def NodePrepareResources(self, request: Any, context: _Ctx) -> Any:  # noqa: N802
        refs = await _refs(request, context)
        results = await self._handler.prepare(refs)
        pb = self._pb
        claims = {
            ref.uid: pb.NodePrepareResourceResponse(
                devices=[
                    pb.Device(
                        request_names=list(d.requests),
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_ids),
                        **({"share_id": d.share_id} if d.share_id else {}),
                    )
                    for d in results[ref.uid].devices
                ],
                error=clip(results[ref.uid].error),
            )
            for ref in refs
        }
        return pb.NodePrepareResourcesResponse(claims=claims)

    async def NodeUnprepareResources(self, request: Any, context: _Ctx) -> Any:  # noqa: N802
        refs = await _refs(request, context)
        errors = await self._handler.unprepare(refs)
        pb = self._pb
        claims = {
            ref.uid: pb.NodeUnprepareResourceResponse(error=clip(errors[ref.uid])) for ref in refs
        }
        return pb.NodeUnprepareResourcesResponse(claims=claims)


class _PluginV1(_Plugin, v1_grpc.DRAPluginServicer):
    pass


class _PluginV1beta1(_Plugin, v1beta1_grpc.DRAPluginServicer):
    pass


class _Health(hpb_grpc.DRAResourceHealthServicer):
    def __init__(self, handler: DraHandler, stopping: asyncio.Event) -> None:
        self._handler = handler
        self._stopping = stopping

    async def NodeWatchResources(  # noqa: N802
        self, request: hpb.NodeWatchResourcesRequest, context: _Ctx
    ) -> AsyncIterator[hpb.NodeWatchResourcesResponse]:
        seen = -1
        while not self._stopping.is_set():
            seen = self._handler.health_generation
            yield hpb.NodeWatchResourcesResponse(
                devices=[
                    hpb.DeviceHealth(
                        device=hpb.DeviceIdentifier(pool_name=h.pool, device_name=h.device),
                        health=hpb.HEALTHY if h.healthy else hpb.UNHEALTHY,
                        last_updated_time=h.since,
                        message=h.message,
                    )
                    for h in self._handler.health()
                ]
            )
            await first_of(self._handler.wait_health_changed(seen), self._stopping.wait())


async def _refs(request: Any, context: _Ctx) -> list[ClaimRef]:
    if len(request.claims) > MAX_CLAIMS:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{len(request.claims)} claims in one call; at most {MAX_CLAIMS}",
        )
    return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]


class DraServer:
    """The DraEndpoint: both sockets of `handler`'s driver, served by one gRPC server each."""

    def __init__(self, handler: DraHandler, *, registry_dir: str, plugin_dir: str) -> None:
        self.handler = handler
        self.registration_path = registration_socket(registry_dir, handler.driver)
        self.service_path = os.path.join(plugin_dir, SERVICE_SOCKET)
        self._servers: list[grpc.aio.Server] = []
        self._bound: dict[str, FileId | None] = {}
        self._stopping = asyncio.Event()
        self._registered = False
        self.status_changed = asyncio.Event()
        self._changes = 0  # registration outcomes told, and stops
        self._changed = asyncio.Condition()

    async def start(self) -> None:
        if self._servers:
            raise GpusliceError(f"DRA plugin {self.handler.driver} already started")
        self._stopping = asyncio.Event()
        self._registered = False
        service = grpc.aio.server(options=SERVER_OPTIONS)
        v1_grpc.add_DRAPluginServicer_to_server(_PluginV1(self.handler, v1), service)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_PluginV1beta1(self.handler, v1beta1), service)
        hpb_grpc.add_DRAResourceHealthServicer_to_server(
            _Health(self.handler, self._stopping), service
        )
        registration = grpc.aio.server(options=SERVER_OPTIONS)
        reg_grpc.add_RegistrationServicer_to_server(
            _Registration(self.handler.driver, self.service_path, self), registration
        )
        # The service first: the kubelet may dial it as soon as registration answers.
        for server, path in ((service, self.service_path), (registration, self.registration_path)):
            try:
                await self._serve(server, path)
            except BaseException:
                await self.stop()
                raise
        _log.info("dra_plugin_serving", driver=self.handler.driver, socket=self.service_path,
                  registration=self.registration_path)  # fmt: skip

    async def _serve(self, server: grpc.aio.Server, path: str) -> None:
        if await answers(path, self._probe(path)):
            await server.stop(None)
            raise SocketTaken(
                f"another process serves {path}; gpuslice leaves it alone and serves once "
                "it is gone"
            )
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            await serve_renamed(server, path)
        except (OSError, RuntimeError) as exc:
            await server.stop(None)
            why = getattr(exc, "strerror", None) or exc
            raise GpusliceError(f"cannot serve the DRA plugin on {path}: {why}") from None
        self._servers.append(server)
        self._bound[path] = file_id(path)

    def _probe(self, path: str) -> Callable[[grpc.aio.Channel, float], Awaitable[object]]:
        """A call that proves a live plugin serves `path`: the registration socket's
        GetInfo, or a Prepare of no claims on the service socket."""

        async def info(channel: grpc.aio.Channel, deadline_s: float) -> object:
            stub: reg_grpc.RegistrationAsyncStub = reg_grpc.RegistrationStub(channel)
            return await stub.GetInfo(reg.InfoRequest(), timeout=deadline_s)

        async def prepare(channel: grpc.aio.Channel, deadline_s: float) -> object:
            stub: v1_grpc.DRAPluginAsyncStub = v1_grpc.DRAPluginStub(channel)
            return await stub.NodePrepareResources(
                v1.NodePrepareResourcesRequest(), timeout=deadline_s
            )

        return info if path == self.registration_path else prepare

    def sockets_present(self) -> bool:
        return bool(self._servers) and all(file_id(p) == fid for p, fid in self._bound.items())

    def registered(self) -> bool:
        return self._registered

    @property
    def registration_changes(self) -> int:
        return self._changes

    async def wait_registration(self, seen: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self._changes != seen)
        return self._changes

    async def _count_change(self) -> None:
        async with self._changed:
            self._changes += 1
            self._changed.notify_all()

    async def _registration_status(self, registered: bool, error: str) -> None:
        self._registered = registered
        log = _log.info if registered else _log.error
        log("dra_plugin_registration", driver=self.handler.driver, registered=registered,
            error=error)  # fmt: skip
        self.status_changed.set()
        self.status_changed = asyncio.Event()
        await self._count_change()

    async def stop(self) -> None:
        self._stopping.set()
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(0.5)
        for path, fid in self._bound.items():
            if fid is not None and file_id(path) == fid:
                with contextlib.suppress(OSError):
                    unlink(path)
        self._bound = {}
        if self._registered:
            await self._count_change()
        self._registered = False
