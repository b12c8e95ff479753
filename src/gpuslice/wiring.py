"""The composition root: the one place that picks real or simulated adapters."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.adapters.kubelet.registration import RegistrationError
from gpuslice.adapters.kubelet.server import DevicePluginServer
from gpuslice.config.convert import allocate_options, resource_settings
from gpuslice.config.flags import resolve, setting
from gpuslice.config.loader import LoadedConfig, load_config_file
from gpuslice.config.v1 import Config
from gpuslice.core.container_spec import CONTROL_DEVICES
from gpuslice.core.ports import GpuBackend
from gpuslice.services.agent import AgentDeps, DirEvents, Settings
from gpuslice.services.plugin_manager import ServedEndpoint
from gpuslice.services.resource_handler import ResourceHandler

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


@dataclass(frozen=True)
class RunOptions:
    """What the command line said: explicit flags (as strings) and the environment."""

    cli_values: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    config_name: str | None = None
    fake_hardware: str | None = None
    fake_events: str | None = None

    @property
    def kubelet_socket(self) -> str:
        return setting("kubelet-socket", self.cli_values, self.env)

    @property
    def plugin_dir(self) -> str:
        return os.path.dirname(self.kubelet_socket) or DEFAULT_PLUGIN_DIR


def effective_config(opts: RunOptions) -> LoadedConfig:
    """The config file (if any) with flags and env vars applied. Raises ConfigError."""
    path = setting("config-file", opts.cli_values, opts.env)
    loaded = load_config_file(path, name=opts.config_name) if path else LoadedConfig(Config())
    config = resolve(loaded.config, opts.cli_values, opts.env)
    return LoadedConfig(config, loaded.warnings, loaded.source, loaded.name)


def settings(opts: RunOptions) -> Settings:
    loaded = effective_config(opts)
    config = loaded.config
    return Settings(
        resources=resource_settings(config),
        allocate=allocate_options(config),
        fail_on_init_error=bool(config.flags.fail_on_init_error),
        warnings=loaded.warnings,
    )


def open_backend(opts: RunOptions) -> GpuBackend:
    """The simulated backend when one is named, NVML otherwise (BackendError if absent)."""
    if opts.fake_hardware:
        from gpuslice.adapters.fake import FakeBackend

        return FakeBackend.from_spec(opts.fake_hardware, opts.fake_events)
    from gpuslice.adapters.nvml import NvmlBackend

    return NvmlBackend.open()


class _Endpoint:
    """A device-plugin server plus where to register it ("" = do not register)."""

    def __init__(self, server: DevicePluginServer, kubelet_socket: str) -> None:
        self._server = server
        self._kubelet_socket = kubelet_socket
        self._kubelet: _Stamp | None = None  # kubelet.sock our registration went to

    async def start(self) -> None:
        await self._server.start()

    async def register(self) -> None:
        if not self._kubelet_socket:
            return
        self._kubelet = None
        kubelet = _stamp(self._kubelet_socket)
        if kubelet is None:
            # Fail at once rather than block: kubelet.sock appearing is watched for.
            raise RegistrationError(
                self._server.resource_name, self._kubelet_socket, "UNAVAILABLE", "no kubelet yet"
            )
        await self._server.register(self._kubelet_socket)
        self._kubelet = kubelet

    def current(self) -> bool:
        if not self._server.socket_present():
            return False
        return not self._kubelet_socket or self._kubelet == _stamp(self._kubelet_socket)

    async def stop(self) -> None:
        self._kubelet = None
        await self._server.stop()


_Stamp = tuple[int, int, int]


def _stamp(path: str) -> _Stamp | None:
    """Which file is at `path` now: a re-created kubelet.sock gets a new stamp."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _watch(path: str, names: Collection[str] | None) -> DirEvents:
    return DirWatcher(path, names)


def agent_deps(opts: RunOptions) -> AgentDeps:
    plugin_dir = opts.plugin_dir
    kubelet_socket = opts.kubelet_socket

    def endpoint(handler: ResourceHandler) -> ServedEndpoint:
        return _Endpoint(DevicePluginServer(handler, plugin_dir), kubelet_socket)

    control = () if opts.fake_hardware else tuple(p for p in CONTROL_DEVICES if os.path.exists(p))
    return AgentDeps(
        open_backend=lambda: open_backend(opts),
        load_settings=lambda: settings(opts),
        endpoint_factory=endpoint,
        plugin_dir=plugin_dir,
        watch=_watch if kubelet_socket else None,
        control_devices=control,
    )
