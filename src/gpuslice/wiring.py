"""The composition root: the one place that picks real or simulated adapters."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.adapters.kubelet.registration import RegistrationError
from gpuslice.adapters.kubelet.server import DevicePluginServer
from gpuslice.config.checks import duration_seconds, show
from gpuslice.config.convert import allocate_options, resource_settings
from gpuslice.config.flags import FLAGS_BY_NAME, resolve, setting, with_defaults
from gpuslice.config.loader import LoadedConfig, load_config_file
from gpuslice.config.v1 import Config, Flags
from gpuslice.core.container_spec import CONTROL_DEVICES
from gpuslice.core.errors import ConfigError
from gpuslice.core.health import XidPolicy
from gpuslice.core.ports import GpuBackend, LabelSink, NodeApi
from gpuslice.services.agent import AgentDeps, DirEvents, Settings
from gpuslice.services.config_manager import REJECTED_REASON, ConfigManager
from gpuslice.services.health_env import recovery_from_env
from gpuslice.services.labeller import NodeFeatureSink
from gpuslice.services.node import Apply, LabelOptions, Node, NodeDeps
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

    def get(self, name: str) -> str:
        """A setting that lives outside the config file (flag > env > default)."""
        return setting(name, self.cli_values, self.env)

    @property
    def config_dir(self) -> str:
        """The mounted ConfigMap directory of per-node configs, if any. Raises ConfigError
        when a config name is given too: there the node label or default picks it."""
        path = self.get("config-file")
        found = self.get("config-file-srcdir") or (path if path and os.path.isdir(path) else "")
        if found and self.config_name is not None:
            label = self.get("node-label")
            raise ConfigError(
                f"--config-name {show(self.config_name)}: not used with the per-node configs of "
                f"{found}; name the config with --default-config (DEFAULT_CONFIG) or the node "
                f"label {label}"
            )
        return found


def effective_config(opts: RunOptions) -> LoadedConfig:
    """The config file (if any) with flags and env vars applied. Raises ConfigError."""
    path = setting("config-file", opts.cli_values, opts.env)
    loaded = load_config_file(path, name=opts.config_name) if path else LoadedConfig(Config())
    config = resolve(loaded.config, opts.cli_values, opts.env)
    return LoadedConfig(config, loaded.warnings, loaded.source, loaded.name)


def settings(opts: RunOptions) -> Settings:
    return settings_from(effective_config(opts), opts)


def settings_from(loaded: LoadedConfig, opts: RunOptions) -> Settings:
    """The agent's settings from one loaded config, with flags and env vars applied
    (resolving twice is harmless: an explicit flag always wins)."""
    config = resolve(loaded.config, opts.cli_values, opts.env)
    return Settings(
        resources=resource_settings(config),
        allocate=allocate_options(config),
        fail_on_init_error=bool(config.flags.fail_on_init_error),
        xid_policy=XidPolicy.from_env(opts.env),
        recovery=recovery_from_env(opts.env),
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
        self._kubelet = kubelet  # where this call goes, answered or not
        try:
            await self._server.register(self._kubelet_socket)
        except BaseException:
            self._kubelet = None
            raise

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


def node_api(opts: RunOptions) -> NodeApi | None:
    """The Kubernetes API for this node when there is one to talk to."""
    kubeconfig = opts.get("kubeconfig")
    if not opts.get("node-name") or not (kubeconfig or opts.env.get("KUBERNETES_SERVICE_HOST")):
        return None
    from gpuslice.adapters.kube import KubeNodeApi

    return KubeNodeApi(
        kubeconfig=kubeconfig or None,
        pod_name=opts.get("pod-name") or None,
        event_namespace=opts.get("namespace"),
    )


def _config_watch(path: str, names: Collection[str] | None) -> DirEvents:
    return DirWatcher(path, names, poll_interval=0.5)


def node_deps(opts: RunOptions, api: NodeApi | None) -> NodeDeps:
    """The agent, plus a per-node config manager and a labeller when configured."""
    node = opts.get("node-name")
    config_dir = opts.config_dir
    manager = None
    if config_dir:
        source = api
        if source is None:  # no cluster: the label reads as unset
            from gpuslice.adapters.kube.memory import MemoryNodeApi

            source = MemoryNodeApi()

        def manager(apply: Apply) -> ConfigManager[Settings]:
            return ConfigManager(
                source,
                node,
                config_dir,
                lambda loaded: settings_from(loaded, opts),
                apply,
                watch=_config_watch,
                label=opts.get("node-label"),
                default=opts.get("default-config") or None,
                fallbacks=_list(opts.get("fallback-strategies")),
            )

    agent = agent_deps(opts)
    if manager is None and api is not None and node:
        # One config file: a refused SIGHUP reload is recorded on the Node as the
        # per-node manager records a refused config.
        async def rejected(message: str) -> None:
            await api.record_event(node, REJECTED_REASON, message, warning=True)

        agent = dataclasses.replace(agent, on_rejected=rejected)
    return NodeDeps(agent=agent, manager=manager, labels=label_options(opts, api))


def label_options(opts: RunOptions, api: NodeApi | None) -> LabelOptions | None:
    """The labeller beside the plugin, when `--labels` asks for one (auto: in a cluster).
    Its flags.gfd settings come from the config file; per-node configs (a directory) are
    chosen later, so there only flags, env vars and defaults count."""
    wanted = opts.get("labels")
    if wanted == "false" or (wanted == "auto" and api is None):
        return None
    return label_output(opts, api, None if opts.config_dir else effective_config(opts).config)


def label_output(
    opts: RunOptions, api: NodeApi | None, config: Config | None = None
) -> LabelOptions:
    """Where labels go and how often, from the flags.gfd settings of `config` (the config
    file, when there is one) with flags and env vars applied: the NodeFeature object
    through the API, or a features.d file. Raises ConfigError when the NodeFeature API is
    asked for and there is no cluster to publish to."""
    flags = label_flags(opts, config)
    gfd = flags.gfd
    sink: LabelSink
    if flags.use_node_feature_api:
        if api is None or not opts.get("node-name"):
            raise ConfigError(
                "useNodeFeatureAPI is true but there is no Kubernetes API to publish the "
                "NodeFeature object to: set --node-name (NODE_NAME) and --kubeconfig (or run "
                "in a cluster), or pass --use-node-feature-api=false to write a features file"
            )
        sink = NodeFeatureSink(api, opts.get("node-name"), opts.get("namespace"))
    else:
        from gpuslice.adapters.nfd_file import FeatureFile

        sink = FeatureFile(gfd.output_file or "")
    return LabelOptions(
        sinks=[sink],
        interval_s=duration_seconds(gfd.sleep_interval or "60s"),
        timestamps=not gfd.no_timestamp,
        machine=machine_type(opts, gfd.machine_type_file or ""),
        oneshot=bool(gfd.oneshot),
    )


def label_flags(opts: RunOptions, config: Config | None = None) -> Flags:
    """The `flags` of `config` with flags, env vars and defaults applied."""
    return with_defaults(resolve(config or Config(), opts.cli_values, opts.env)).flags


def machine_type(opts: RunOptions, path: str) -> str | None:
    """The machine type from `path`; None (the snapshot's own) when unreadable, and on
    simulated hardware unless a file other than the default is named (the host's DMI
    name would otherwise replace the simulated node's)."""
    if opts.fake_hardware and path == FLAGS_BY_NAME["machine-type-file"].default:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _list(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


async def run_node(opts: RunOptions, stop: asyncio.Event, reload: asyncio.Event) -> None:
    """`gpuslice run`: the whole agent until `stop`, with the probe endpoint if asked."""
    api = node_api(opts)
    try:
        node = Node(node_deps(opts, api))
        async with contextlib.AsyncExitStack() as stack:
            address = opts.get("status-address")
            if address:
                from gpuslice.adapters.status_http import StatusServer

                await stack.enter_async_context(StatusServer(address, node.readiness))
            await node.run(stop, reload)
    finally:
        if api is not None:
            await api.aclose()
