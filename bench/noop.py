"""Baselines: the transport's own cost, with the same generated stubs and grpc.aio.

NoopServer is a device-plugin server built exactly as ours is (grpc.aio.server() on a
unix socket) whose handlers answer at once with a prebuilt message. ReferencePlugin is
the least a plugin can do on a kubelet restart: see kubelet.sock created, serve its
sockets again and call Register.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from gpuslice.adapters.deviceplugin.api import KUBELET_SOCKET_NAME, pb, pb_grpc, unix_target
from gpuslice.adapters.deviceplugin.registration import register
from gpuslice.adapters.fswatch import DirWatcher

_Ctx = grpc.aio.ServicerContext[Any, Any]
_OPTIONS = pb.DevicePluginOptions(get_preferred_allocation_available=True)
_ALLOCATED = pb.AllocateResponse()
_PREFERRED = pb.PreferredAllocationResponse()


class NoopServicer(pb_grpc.DevicePluginServicer):
    """Every call answered immediately; ListAndWatch sends `listing` and then holds."""

    def __init__(self, listing: pb.ListAndWatchResponse | None = None) -> None:
        self.listing = listing or pb.ListAndWatchResponse()

    async def GetDevicePluginOptions(  # noqa: N802
        self, request: pb.Empty, context: _Ctx
    ) -> pb.DevicePluginOptions:
        return _OPTIONS

    async def ListAndWatch(  # noqa: N802
        self, request: pb.Empty, context: _Ctx
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        yield self.listing
        await asyncio.Event().wait()  # held open until the client or the server ends it

    async def Allocate(  # noqa: N802
        self, request: pb.AllocateRequest, context: _Ctx
    ) -> pb.AllocateResponse:
        return _ALLOCATED

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: _Ctx
    ) -> pb.PreferredAllocationResponse:
        return _PREFERRED

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: _Ctx
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class NoopServer:
    def __init__(self, socket_path: str, listing: pb.ListAndWatchResponse | None = None) -> None:
        self.socket_path = socket_path
        self.servicer = NoopServicer(listing)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        server.add_insecure_port(unix_target(self.socket_path))
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)

    async def __aenter__(self) -> NoopServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def channel(socket_path: str) -> grpc.aio.Channel:
    """A client channel of the kind the stand-in (and the kubelet) opens."""
    return grpc.aio.insecure_channel(unix_target(socket_path))


def stub(chan: grpc.aio.Channel) -> pb_grpc.DevicePluginAsyncStub:
    client: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(chan)
    return client


class ReferencePlugin:
    """No-op servers for `resources`, re-served and re-registered on each kubelet.sock."""

    def __init__(self, plugin_dir: str, resources: Sequence[str]) -> None:
        self._dir = plugin_dir
        self._kubelet = os.path.join(plugin_dir, KUBELET_SOCKET_NAME)
        self._servers = {
            name: NoopServer(os.path.join(plugin_dir, f"ref-{i}.sock"))
            for i, name in enumerate(resources)
        }
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ReferencePlugin:
        watcher = DirWatcher(self._dir, {KUBELET_SOCKET_NAME})
        await watcher.__aenter__()
        await asyncio.gather(*(self._serve(name) for name in self._servers))
        self._task = asyncio.create_task(self._follow(watcher))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(s.stop() for s in self._servers.values()))

    async def _follow(self, watcher: DirWatcher) -> None:
        try:
            async for name, kind in watcher:
                if name == KUBELET_SOCKET_NAME and kind == "created":
                    await asyncio.gather(*(self._serve(n) for n in self._servers))
        finally:
            await watcher.close()

    async def _serve(self, name: str) -> None:
        server = self._servers[name]
        await server.stop()
        await server.start()
        endpoint = os.path.basename(server.socket_path)
        await register(self._kubelet, endpoint=endpoint, resource_name=name)
