"""The real PluginEndpoint: a device-plugin server, its registration with the
kubelet, and which kubelet.sock that registration went to.

A kubelet restart creates kubelet.sock again; the file's stamp (device, inode,
ctime) tells a registration with the kubelet serving now from one with a kubelet
since gone. The server's own crash watch (down / wait_down) is passed through.
"""

from __future__ import annotations

from gpuslice.adapters.deviceplugin.registration import RegistrationError
from gpuslice.adapters.deviceplugin.server import DevicePluginServer
from gpuslice.adapters.fswatch import FileId, file_id
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import Metrics, PluginHandler


class KubeletEndpoint:
    """Serves one resource on <plugin_dir>/<socket> and registers it at `kubelet_socket`
    ("" = serve without registering)."""

    def __init__(self, server: DevicePluginServer, kubelet_socket: str) -> None:
        self.server = server
        self._kubelet_socket = kubelet_socket
        self._kubelet: FileId | None = None  # kubelet.sock our registration went to

    @classmethod
    def create(
        cls,
        handler: PluginHandler,
        plugin_dir: str,
        kubelet_socket: str,
        metrics: Metrics = NO_METRICS,
    ) -> KubeletEndpoint:
        """The endpoint of a new server for `handler` in `plugin_dir`."""
        return cls(DevicePluginServer(handler, plugin_dir, metrics=metrics), kubelet_socket)

    async def start(self) -> None:
        await self.server.start()

    async def register(self) -> None:
        if not self._kubelet_socket:
            return
        self._kubelet = None
        kubelet = file_id(self._kubelet_socket)
        if kubelet is None:
            # Fail at once rather than block: kubelet.sock appearing is watched for.
            raise RegistrationError(
                self.server.resource_name, self._kubelet_socket, "UNAVAILABLE", "no kubelet yet"
            )
        self._kubelet = kubelet  # where this call goes, answered or not
        try:
            await self.server.register(self._kubelet_socket)
        except BaseException:
            self._kubelet = None
            raise

    def socket_present(self) -> bool:
        return self.server.socket_present()

    def current(self) -> bool:
        if not self.server.socket_present():
            return False
        return not self._kubelet_socket or self._kubelet == file_id(self._kubelet_socket)

    def down(self) -> str | None:
        return self.server.down()

    async def wait_down(self) -> str:
        return await self.server.wait_down()

    async def end_streams(self, timeout_s: float) -> bool:
        return await self.server.end_streams(timeout_s)

    def release_socket(self) -> None:
        self.server.release_socket()

    async def wait_dropped(self) -> None:
        await self.server.wait_dropped()

    async def stop(self) -> None:
        self._kubelet = None
        await self.server.stop()
