"""One device-plugin gRPC server: a unix socket in the device-plugin directory.

Requests are capped at adapters.kubelet_socket.MAX_REQUEST_BYTES, the kubelet's own limit
on what it receives from us: a larger one is refused with RESOURCE_EXHAUSTED before it
reaches the servicer. A server that stops without stop() being called (the gRPC
server ended under us) is reported through wait_down(). A socket file another live
device plugin serves (one that answers the API: adapters.deviceplugin.liveness) is never
replaced: start() raises SocketTaken. Anything else there (a stale file, a socket that
accepts and does not speak the API) is replaced.

The socket is bound and renamed into place (adapters.kubelet_socket.serve_renamed). stop()
removes the public file only while it is still the one we bound. In a hand-over,
end_streams() ends the kubelet's streams and waits for the kubelet to hang up
(adapters.deviceplugin.hangup) before anything else stops.
"""

from __future__ import annotations

import asyncio
import os

import grpc
import structlog

from gpuslice.adapters.deviceplugin.api import pb_grpc
from gpuslice.adapters.deviceplugin.hangup import wait_hung_up
from gpuslice.adapters.deviceplugin.liveness import serves_device_plugin
from gpuslice.adapters.deviceplugin.registration import register
from gpuslice.adapters.deviceplugin.servicer import HandlerServicer
from gpuslice.adapters.fswatch import FileId, file_id
from gpuslice.adapters.kubelet_socket import (
    MAX_REQUEST_BYTES,
    SERVER_OPTIONS,
    serve_renamed,
    unlink,
)
from gpuslice.core.errors import GpusliceError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import Metrics, PluginHandler, SocketTaken
from gpuslice.core.resources import socket_name as default_socket_name

_log = structlog.get_logger()
# Before ending its streams for a successor, a server waits for a pause between the
# kubelet's admissions: a call in flight when the kubelet drops us would fail its pod.
QUIET_GAP_S = 0.02
QUIET_LIMIT_S = 0.5


__all__ = ["MAX_REQUEST_BYTES", "DevicePluginServer", "ServerError"]


class ServerError(GpusliceError):
    """The plugin's socket could not be served."""


class DevicePluginServer:
    """Serves one resource's PluginHandler on <plugin_dir>/<socket_name>."""

    def __init__(
        self,
        handler: PluginHandler,
        plugin_dir: str,
        socket_name: str | None = None,
        *,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.handler = handler
        self._metrics = metrics
        self.resource_name = handler.resource_name
        self.socket_name = socket_name or default_socket_name(self.resource_name)
        self.socket_path = os.path.join(plugin_dir, self.socket_name)
        self._server: grpc.aio.Server | None = None
        self._servicer: HandlerServicer | None = None
        self._bound: FileId | None = None  # the socket file we created
        self._bound_name = ""  # the private name it was bound under
        self._watch: asyncio.Task[None] | None = None
        self._down = asyncio.Event()
        self._down_reason = ""
        self._dropped = asyncio.Event()

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Remove a stale socket, bind ours and serve. Raises SocketTaken, leaving the
        file alone, when another process serves that path now."""
        if self._server is not None:
            raise ServerError(f"device-plugin server for {self.resource_name} already started")
        self._down = asyncio.Event()
        if await serves_device_plugin(self.socket_path):
            raise SocketTaken(
                f"another device plugin serves {self.resource_name} on {self.socket_path}; "
                "gpuslice leaves it alone and serves once it is gone"
            )
        self._dropped = asyncio.Event()
        servicer = HandlerServicer(self.handler, self._metrics, self._dropped.set)
        server = grpc.aio.server(options=SERVER_OPTIONS)
        pb_grpc.add_DevicePluginServicer_to_server(servicer, server)
        try:
            self._bound_name = await serve_renamed(server, self.socket_path)
        except OSError as exc:
            reason = f"cannot replace {self.socket_path}: {exc.strerror or exc}"
            raise ServerError(f"cannot serve {self.resource_name}: {reason}") from None
        except RuntimeError as exc:
            reason = f"cannot serve {self.resource_name} on {self.socket_path}: {exc}"
            raise ServerError(reason) from None
        self._server, self._servicer = server, servicer
        self._bound = file_id(self.socket_path)  # after the rename, which sets its ctime
        self._watch = asyncio.create_task(self._watch_termination(server))
        _log.info("plugin_serving", resource=self.resource_name, socket=self.socket_path)

    async def register(self, kubelet_socket_path: str, timeout_s: float = 5.0) -> None:
        """Register our endpoint (the socket's base name). Raises RegistrationError."""
        await register(
            kubelet_socket_path,
            endpoint=self.socket_name,
            resource_name=self.resource_name,
            timeout_s=timeout_s,
        )

    def socket_present(self) -> bool:
        """True while we serve and the socket file we bound is still in place."""
        if self._down.is_set():
            return False
        return self._bound is not None and file_id(self.socket_path) == self._bound

    def down(self) -> str | None:
        """Why the server stopped serving on its own since start(), or None."""
        return self._down_reason if self._down.is_set() else None

    async def wait_down(self) -> str:
        """Return why, once the server has stopped serving on its own (call after start())."""
        down = self._down
        await down.wait()
        return self._down_reason

    async def end_streams(self, timeout_s: float) -> bool:
        """End every ListAndWatch stream, still serving, and return True once the kubelet
        hung up on us (at once when it had no connection), False after `timeout_s`. The
        streams end in a pause between admissions (QUIET_GAP_S, QUIET_LIMIT_S at most)."""
        servicer = self._servicer
        if servicer is None:
            return True
        await servicer.quiet(QUIET_GAP_S, QUIET_LIMIT_S)
        return await wait_hung_up(self._bound_name, timeout_s, servicer.stop_streams)

    def release_socket(self) -> None:
        """Remove our socket file and keep serving: connections already made (the
        kubelet's) go on, and a successor can bind the path. stop() ends the rest."""
        if self._bound is not None and file_id(self.socket_path) == self._bound:
            try:
                unlink(self.socket_path)
            except OSError as exc:
                _log.warning("plugin_socket_not_removed", socket=self.socket_path, error=str(exc))
        self._bound = None

    async def wait_dropped(self) -> None:
        """Return once the kubelet has cancelled a ListAndWatch stream of this server
        (call after start(); each call waits for the next cancel)."""
        dropped = self._dropped
        await dropped.wait()
        dropped.clear()

    def _mark_down(self) -> None:
        self._down_reason = f"the gRPC server for {self.resource_name} stopped on its own"
        _log.error("plugin_server_down", resource=self.resource_name, socket=self.socket_path)
        self._down.set()

    async def _watch_termination(self, server: grpc.aio.Server) -> None:
        await server.wait_for_termination()
        if self._server is server and not self._down.is_set():  # not ended by stop()
            self._mark_down()

    async def stop(self, grace: float | None = 1.0) -> None:
        """End ListAndWatch streams, stop serving and remove our socket file."""
        server, servicer = self._server, self._servicer
        if server is None or servicer is None:
            return
        if not self._down.is_set() and _shutting_down(server):
            self._mark_down()  # it was already ending: stop() only came after
        self._server = self._servicer = None
        servicer.stop_streams()
        await server.stop(grace)
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch  # ends with the server, reporting nothing
        self.release_socket()  # a failure is logged: the next start says why
        _log.info("plugin_stopped", resource=self.resource_name, socket=self.socket_path)


def _shutting_down(server: grpc.aio.Server) -> bool:
    """True when gRPC has begun shutting `server` down. grpc.aio has no public way to
    ask; its core server's is_running() answers (False, unknown, when it is absent).
    A dying server unlinks its socket before it has fully terminated, so a deleted
    socket can bring stop() here first."""
    core = getattr(server, "_server", None)
    is_running = getattr(core, "is_running", None)
    return callable(is_running) and not is_running()
