"""One device-plugin gRPC server: a unix socket in the device-plugin directory."""

from __future__ import annotations

import contextlib
import os

import grpc
import structlog

from gpuslice.adapters.kubelet.api import pb_grpc, unix_target
from gpuslice.adapters.kubelet.registration import register
from gpuslice.adapters.kubelet.servicer import DevicePluginServicer
from gpuslice.core.errors import GpusliceError
from gpuslice.core.ports import PluginHandler
from gpuslice.core.resources import socket_name as default_socket_name

_log = structlog.get_logger()


class ServerError(GpusliceError):
    """The plugin's socket could not be served."""


class DevicePluginServer:
    """Serves one resource's PluginHandler on <plugin_dir>/<socket_name>."""

    def __init__(
        self, handler: PluginHandler, plugin_dir: str, socket_name: str | None = None
    ) -> None:
        self.handler = handler
        self.resource_name = handler.resource_name
        self.socket_name = socket_name or default_socket_name(self.resource_name)
        self.socket_path = os.path.join(plugin_dir, self.socket_name)
        self._server: grpc.aio.Server | None = None
        self._servicer: DevicePluginServicer | None = None
        self._inode: int | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Remove a stale socket, bind ours and serve."""
        if self._server is not None:
            raise ServerError(f"device-plugin server for {self.resource_name} already started")
        _unlink(self.socket_path)
        servicer = DevicePluginServicer(self.handler)
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(servicer, server)
        try:
            server.add_insecure_port(unix_target(self.socket_path))
        except RuntimeError as exc:
            await server.stop(None)
            reason = f"cannot serve {self.resource_name} on {self.socket_path}: {exc}"
            raise ServerError(reason) from None
        await server.start()
        self._server, self._servicer = server, servicer
        self._inode = _inode(self.socket_path)
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
        """True while our socket file (the inode we bound) is still in place."""
        return self._inode is not None and _inode(self.socket_path) == self._inode

    async def stop(self, grace: float | None = 1.0) -> None:
        """End ListAndWatch streams, stop serving and remove our socket file."""
        server, servicer = self._server, self._servicer
        if server is None or servicer is None:
            return
        self._server = self._servicer = None
        servicer.stop_streams()
        await server.stop(grace)
        if self._inode is not None and _inode(self.socket_path) == self._inode:
            _unlink(self.socket_path)
        self._inode = None
        _log.info("plugin_stopped", resource=self.resource_name, socket=self.socket_path)


def _inode(path: str) -> int | None:
    try:
        return os.lstat(path).st_ino
    except FileNotFoundError:
        return None


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
