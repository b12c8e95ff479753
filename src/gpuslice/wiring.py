"""The composition root: the one place that picks real or simulated adapters."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, cast

from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.adapters.kubelet.dirlock import Holder, claim, directory_present
from gpuslice.adapters.kubelet.endpoint import KubeletEndpoint
from gpuslice.adapters.kubelet.handover import DirClaim
from gpuslice.config import settings as config_settings
from gpuslice.config.checks import duration_seconds, show
from gpuslice.config.flags import FALSE_WORDS, FLAGS_BY_NAME, resolve, setting, with_defaults
from gpuslice.config.loader import LoadedConfig
from gpuslice.config.settings import Settings
from gpuslice.config.v1 import Config, Flags
from gpuslice.core.cdi import EXTRA_NODES
from gpuslice.core.container_spec import CONTROL_DEVICES, IMEX_CHANNELS
from gpuslice.core.errors import ConfigError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import (
    GpuBackend,
    LabelSink,
    Metrics,
    NodeApi,
    PluginEndpoint,
    PodEvents,
    PodResources,
    ProcessOwners,
)
from gpuslice.core.watchdog import Policy, parse_budgets
from gpuslice.services.agent import Agent, AgentDeps, DirEvents
from gpuslice.services.cdi import CdiSpecs
from gpuslice.services.config_manager import REJECTED_REASON, ConfigManager
from gpuslice.services.config_source import ConfigMapEntries, DirectoryEntries, EntrySource
from gpuslice.services.labeller import NodeFeatureSink
from gpuslice.services.mps import MPS_WAITING_REASON, MpsDaemons
from gpuslice.services.node import Apply, LabelOptions, Node, NodeDeps
from gpuslice.services.node_state import node_state
from gpuslice.services.resource_handler import ResourceHandler
from gpuslice.services.sampler import Sampler, interval_seconds
from gpuslice.services.watchdog import Watchdog

if TYPE_CHECKING:
    from gpuslice.adapters.kubelet.podresources import PodResourcesClient
    from gpuslice.adapters.metrics import PrometheusMetrics
    from gpuslice.adapters.status_http import StatusServer

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


@dataclass(frozen=True)
class RunOptions:
    """What the command line said: explicit flags (as strings) and the environment."""

    cli_values: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    config_name: str | None = None
    fake_hardware: str | None = None
    fake_events: str | None = None
    # With --kubelet-socket "" (do not register): a private directory of this process
    # for the plugin sockets, so the node's device-plugin directory is never touched.
    own_plugin_dir: str | None = None

    @property
    def kubelet_socket(self) -> str:
        return setting("kubelet-socket", self.cli_values, self.env)

    @property
    def plugin_dir(self) -> str:
        if not self.kubelet_socket and self.own_plugin_dir:
            return self.own_plugin_dir
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
        if found and self.config_map:
            raise ConfigError(
                f"--config-map (CONFIG_MAP) {show(self.config_map)} and the config directory "
                f"{found}: give one source of per-node configs, not both"
            )
        self._check_no_config_name(found)
        return found

    @property
    def config_map(self) -> str:
        """The ConfigMap of per-node configs read through the API, if any."""
        return self.get("config-map")

    @property
    def per_node(self) -> bool:
        """Whether the config is chosen per node (a directory or a ConfigMap of configs).
        Raises ConfigError for both at once, or with a config name."""
        found = self.config_dir
        if self.config_map:
            self._check_no_config_name(f"ConfigMap {self.config_map}")
        return bool(found or self.config_map)

    def _check_no_config_name(self, source: str) -> None:
        if source and self.config_name is not None:
            label = self.get("node-label")
            raise ConfigError(
                f"--config-name {show(self.config_name)}: not used with the per-node configs of "
                f"{source}; name the config with --default-config (DEFAULT_CONFIG) or the node "
                f"label {label}"
            )


def effective_config(opts: RunOptions) -> LoadedConfig:
    """The config file (if any) with flags and env vars applied. Raises ConfigError."""
    return config_settings.effective_config(opts.cli_values, opts.env, config_name=opts.config_name)


def settings(opts: RunOptions) -> Settings:
    """The device plugin's complete settings from the config file, flags and env.
    Raises ConfigError (HardwareError for a required IMEX channel that is missing)."""
    return config_settings.load_settings(
        opts.cli_values, opts.env, config_name=opts.config_name, imex_present=imex_present(opts)
    )


def settings_from(loaded: LoadedConfig, opts: RunOptions, *, plugin: bool = False) -> Settings:
    """The settings of one loaded config (a per-node entry), with flags and env applied;
    with the device plugin's start-up rules when `plugin` (not for labels alone)."""
    present = imex_present(opts) if plugin else None
    return config_settings.settings_from(loaded, opts.cli_values, opts.env, imex_present=present)


def imex_present(opts: RunOptions) -> frozenset[int]:
    """The IMEX channels whose device node exists: on simulated hardware, those its node
    file lists; else under /dev or the driver root as mounted in this container."""
    if opts.fake_hardware:
        from gpuslice.adapters.fake import imex_channels

        try:
            return imex_channels(opts.fake_hardware)
        except ConfigError:
            return frozenset()  # opening the backend reports the bad node file
    from gpuslice.adapters.imex import existing_channels

    return existing_channels(IMEX_CHANNELS, roots=("/", opts.get("driver-root-ctr-path")))


def open_backend(opts: RunOptions) -> GpuBackend:
    """The simulated backend when one is named, NVML otherwise (BackendError if absent)."""
    if opts.fake_hardware:
        from gpuslice.adapters.fake import FakeBackend

        return FakeBackend.from_spec(opts.fake_hardware, opts.fake_events)
    from gpuslice.adapters.nvml import NvmlBackend

    return NvmlBackend.open(driver_root=opts.get("driver-root-ctr-path") or "/driver-root")


def _watch(path: str, names: Collection[str] | None) -> DirEvents:
    return DirWatcher(path, names)


def agent_deps(opts: RunOptions, metrics: Metrics = NO_METRICS) -> AgentDeps:
    plugin_dir = opts.plugin_dir
    kubelet_socket = opts.kubelet_socket

    def endpoint(handler: ResourceHandler) -> PluginEndpoint:
        return KubeletEndpoint.create(handler, plugin_dir, kubelet_socket, metrics)

    control = () if opts.fake_hardware else tuple(p for p in CONTROL_DEVICES if os.path.exists(p))
    return AgentDeps(
        open_backend=lambda: open_backend(opts),
        load_settings=lambda: settings(opts),
        endpoint_factory=endpoint,
        plugin_dir=plugin_dir,
        watch=_watch if kubelet_socket else None,
        control_devices=control,
        cdi=cdi_specs(opts, control),
        metrics=metrics,
        pod_resources=lambda: _held_back_by(opts),
        mps=mps_daemons(opts),
    )


def pinned_limit(opts: RunOptions) -> int:
    """--mps-pinned-memory-limit in MiB (0: the GPU's memory / replicas)."""
    return int(opts.get("mps-pinned-memory-limit") or 0)


def mps_binary(opts: RunOptions) -> list[str]:
    """The MPS control binary: the simulated one on simulated hardware unless
    --mps-control-binary names one."""
    binary = [opts.get("mps-control-binary")]
    if opts.fake_hardware and binary[0] == FLAGS_BY_NAME["mps-control-binary"].default:
        binary = [sys.executable, "-m", "gpuslice.testing.mps_control"]
    return binary


def mps_daemons(opts: RunOptions) -> MpsDaemons:
    """MPS control daemons (started only for MPS resources): from `gpuslice mps-control`
    when --mps-control-socket names it, else from the agent itself."""
    from gpuslice.adapters.mps import ControlCommands, LocalLauncher, RemoteLauncher

    binary, socket = mps_binary(opts), opts.get("mps-control-socket")
    return MpsDaemons(
        RemoteLauncher(socket) if socket else LocalLauncher(binary),
        ControlCommands(binary),
        pinned_limit_mib=pinned_limit(opts),
        roots=(opts.get("mps-root"),),
    )


@contextlib.asynccontextmanager
async def _held_back_by(opts: RunOptions) -> AsyncIterator[PodResources]:
    """PodResources for holding back moved devices (services.holds), accounting or not:
    a short timeout, since the agent reads it before serving each config."""
    from gpuslice.adapters.kubelet.podresources import PodResourcesClient

    checkpoint = os.path.join(opts.plugin_dir, "kubelet_internal_checkpoint")
    client = PodResourcesClient(opts.get("pod-resources-socket"), checkpoint, timeout_s=2.0)
    try:
        yield client
    finally:
        await client.aclose()


def cdi_specs(opts: RunOptions, control: tuple[str, ...]) -> CdiSpecs | None:
    """The CDI spec writer (None: --cdi-spec-dir is empty). It is always wired, since a
    reload may switch to a cdi-* strategy, and writes nothing under the others."""
    directory = opts.get("cdi-spec-dir")
    if not directory:
        return None
    from gpuslice.adapters.cdi_file import CdiSpecDir, find_toolkit_devices, present_nodes

    extra = {} if opts.fake_hardware else {k: present_nodes(v) for k, v in EXTRA_NODES.items()}
    return CdiSpecs(
        CdiSpecDir(directory),
        control_devices=control,
        extra_nodes=extra,
        find_toolkit=partial(find_toolkit_devices, directory),
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
        host=opts.get("node-name"),
    )


def _config_watch(path: str, names: Collection[str] | None) -> DirEvents:
    return DirWatcher(path, names, poll_interval=0.5)


def node_deps(opts: RunOptions, api: NodeApi | None, metrics: Metrics = NO_METRICS) -> NodeDeps:
    """The agent, plus a per-node config manager and a labeller when configured."""
    node = opts.get("node-name")
    entries = config_entries(opts, api)
    manager = None
    if entries is not None:
        source = api
        if source is None:  # no cluster: the label reads as unset
            from gpuslice.adapters.kube.memory import MemoryNodeApi

            source = MemoryNodeApi()

        def manager(apply: Apply) -> ConfigManager[Settings]:
            assert entries is not None
            return ConfigManager(
                source,
                node,
                entries,
                lambda loaded: settings_from(loaded, opts, plugin=True),
                apply,
                label=opts.get("node-label"),
                default=opts.get("default-config") or None,
                fallbacks=_list(opts.get("fallback-strategies")),
                metrics=metrics,
            )

    agent = agent_deps(opts, metrics)
    if manager is None and api is not None and node:
        # One config file: a refused SIGHUP reload is recorded on the Node as the
        # per-node manager records a refused config.
        async def rejected(message: str) -> None:
            await api.record_event(node, REJECTED_REASON, message, warning=True)

        agent = dataclasses.replace(agent, on_rejected=rejected)
    if agent.mps is not None and api is not None and node:
        # New MPS replicas withheld while an old daemon's clients finish: on the Node.
        async def mps_waiting(message: str) -> None:
            await api.record_event(node, MPS_WAITING_REASON, message, warning=True)

        agent.mps.notify = mps_waiting
    return NodeDeps(agent=agent, manager=manager, labels=label_options(opts, api))


def config_entries(opts: RunOptions, api: NodeApi | None) -> EntrySource | None:
    """Where the per-node configs come from: the ConfigMap through the API, a mounted
    directory, or None (one config file). Raises ConfigError naming what is missing."""
    if not opts.per_node:
        return None
    config_map, config_dir = opts.config_map, opts.config_dir
    if not opts.get("node-name"):
        given, path = (
            ("--config-map (CONFIG_MAP)", config_map)
            if config_map
            else (_dir_flag(opts), config_dir)
        )
        raise ConfigError(_NO_NODE_NAME.format(given=given, path=path))
    if not config_map:
        return DirectoryEntries(config_dir, _config_watch)
    if api is None:
        raise ConfigError(
            f"--config-map (CONFIG_MAP) {config_map}: the ConfigMap is read through the "
            "Kubernetes API, and there is none: run in a cluster or set --kubeconfig (KUBECONFIG)"
        )
    return ConfigMapEntries(api, opts.get("namespace"), config_map)


_NO_NODE_NAME = (
    "{given} {path}: per-node configs need this node's name to read its label; set "
    "--node-name or NODE_NAME (usually from the downward API, fieldPath spec.nodeName), "
    "otherwise every node would serve the default config"
)


def _dir_flag(opts: RunOptions) -> str:
    if opts.get("config-file-srcdir"):
        return "--config-file-srcdir (CONFIG_FILE_SRCDIR)"
    return "--config-file (CONFIG_FILE), a directory,"


def label_options(opts: RunOptions, api: NodeApi | None) -> LabelOptions | None:
    """The labeller beside the plugin, when `--labels` asks for one (auto: in a cluster).
    Its flags.gfd settings come from the config file; per-node configs (a directory) are
    chosen later, so there only flags, env vars and defaults count."""
    wanted = opts.get("labels")
    if wanted == "false" or (wanted == "auto" and api is None):
        return None
    return label_output(opts, api, None if opts.per_node else effective_config(opts).config)


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


def lock_holder(opts: RunOptions) -> Holder:
    """Who this agent is, for another agent waiting on the device-plugin directory."""
    return Holder(
        os.getpid(),
        opts.get("pod-name"),
        opts.get("node-name"),
        socket.gethostname(),
        token=secrets.token_hex(8),
    )


async def run_node(opts: RunOptions, stop: asyncio.Event, reload: asyncio.Event) -> None:
    """`gpuslice run`: the whole agent until `stop`, with the probe endpoint if asked.
    It serves once the device-plugin directory exists and no other agent holds it."""
    own_dir = None
    if not opts.kubelet_socket:  # not registering: nothing of the kubelet's is used
        own_dir = tempfile.mkdtemp(prefix="gpuslice-plugins-")
        opts = replace(opts, own_plugin_dir=own_dir)
    api = node_api(opts)
    try:
        address, metrics_address = opts.get("status-address"), opts.get("metrics-address")
        metrics = prometheus_metrics(opts) if address or metrics_address else None
        deps = node_deps(opts, api, metrics or NO_METRICS)
        pods = pod_resources(opts)
        if pods is not None:
            deps.accounting = accounting(opts, api, metrics or NO_METRICS, pods)
        if own_dir is None:  # the node's directory: one agent at a time
            deps.agent.claim_dir = lambda stop, waiting: _claim(opts, stop, waiting)
        node = Node(deps)
        async with contextlib.AsyncExitStack() as stack:
            if pods is not None:
                stack.push_async_callback(pods.aclose)
            if metrics is not None:
                _watch_node(metrics, node)
            for server in _http_servers(address, metrics_address, node, metrics):
                await stack.enter_async_context(server)
            if own_dir is None and not await directory_present(opts.plugin_dir, stop):
                return  # stopped while waiting for the directory
            await node.run(stop, reload)
    finally:
        if api is not None:
            await api.aclose()
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)


def _http_servers(
    address: str, metrics_address: str, node: Node, metrics: PrometheusMetrics | None
) -> list[StatusServer]:
    """The probes on `address`, with /metrics there too unless it has its own address."""
    from gpuslice.adapters.status_http import METRICS_NAME, SharedRender, StatusServer

    page = None if metrics is None else SharedRender(metrics.page, metrics.prepare)
    servers = []
    if address:
        servers.append(StatusServer(address, node.readiness, None if metrics_address else page))
    if metrics_address:
        servers.append(StatusServer(metrics_address, None, page, name=METRICS_NAME))
    return servers


async def _claim(
    opts: RunOptions, stop: asyncio.Event, waiting: Callable[[str], None]
) -> DirClaim | None:
    """The device-plugin directory, once no other agent holds it."""
    lock = await claim(opts.plugin_dir, lock_holder(opts), stop, waiting)
    return None if lock is None else DirClaim(lock)


def prometheus_metrics(opts: RunOptions) -> PrometheusMetrics:
    """The Prometheus adapter, imported only for an agent serving /metrics."""
    from gpuslice.adapters.metrics import PrometheusMetrics

    return PrometheusMetrics(hostname=opts.get("node-name") or socket.gethostname())


def _watch_node(metrics: PrometheusMetrics, node: Node) -> None:
    """Series read from the node at each scrape: resources, GPUs, the config."""
    from gpuslice.adapters.metrics import NodeStateCollector

    metrics.add(NodeStateCollector(lambda: node_state(node), hostname=metrics.hostname))
    sampler, watchdog = node.sampler, node.watchdog
    if sampler is not None:
        from gpuslice.adapters.metrics import AccountingCollector, BudgetCollector

        metrics.add(AccountingCollector(lambda: sampler.latest, hostname=metrics.hostname))
        if watchdog is not None:
            metrics.add(BudgetCollector(lambda: watchdog.latest, hostname=metrics.hostname))


def pod_resources(opts: RunOptions) -> PodResourcesClient | None:
    """The kubelet's PodResources API and device checkpoint (None: accounting is off).
    Nothing connects until the first sample: a missing socket fails samples, not the agent."""
    if opts.get("accounting").strip().lower() in FALSE_WORDS:
        return None
    from gpuslice.adapters.kubelet.podresources import PodResourcesClient

    checkpoint = os.path.join(opts.plugin_dir, "kubelet_internal_checkpoint")
    return PodResourcesClient(opts.get("pod-resources-socket"), checkpoint)


def accounting(
    opts: RunOptions, api: NodeApi | None, metrics: Metrics, pods: PodResources
) -> Callable[[Agent], tuple[Sampler, Watchdog | None]]:
    """The sampler beside the agent and the memory-budget watchdog it feeds. On simulated
    hardware the backend knows its processes' pods; on a node, their cgroups under
    --proc-root do. Raises ConfigError for a bad interval or budget."""
    interval = interval_seconds(opts.get("sample-interval"))
    overrides = parse_budgets(opts.get("memory-budget"))
    policy = Policy(opts.get("memory-budget-policy"))
    owners: ProcessOwners | None = None
    kill = _kill  # simulated: the events file says which pod a PID is in
    if not opts.fake_hardware:
        from gpuslice.adapters.cgroups import CgroupOwners

        cgroups = CgroupOwners(opts.get("proc-root"))
        owners, kill = cgroups, cgroups.kill
    events = cast(PodEvents, api) if hasattr(api, "record_pod_event") else None

    def build(agent: Agent) -> tuple[Sampler, Watchdog | None]:
        watchdog = Watchdog(
            policy,
            overrides,
            lambda: agent.snapshot,
            hold=agent.manager.hold_unhealthy,
            kill=kill,
            events=events,
            metrics=metrics,
        )
        sampler = Sampler(
            agent.on_backend,
            lambda: agent.snapshot,
            pods,
            owners,
            interval_s=interval,
            sampled=metrics.sampled,
            failed=metrics.sample_failed,
            after=watchdog.check,
        )
        return sampler, watchdog

    return build


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
