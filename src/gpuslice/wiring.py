"""The composition root: the one place that picks real or simulated adapters, and that
builds the nodes of `gpuslice run`, `gpuslice labels` and `gpuslice demo` from the
command's resolved options (config.options.RunOptions)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, cast

from gpuslice.adapters.deviceplugin.dirlock import Holder, claim, directory_present
from gpuslice.adapters.deviceplugin.endpoint import KubeletEndpoint
from gpuslice.adapters.deviceplugin.handover import DirClaim
from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.adapters.outside_files import read_text
from gpuslice.config.loader import LoadedConfig
from gpuslice.config.options import (
    DEFAULT_MACHINE_TYPE_FILE,
    DEFAULT_MPS_CONTROL,
    NO_API_FOR_CONFIG_MAP,
    NO_API_FOR_DRA,
    NO_API_FOR_NODE_FEATURES,
    RunOptions,
    resolve_options,
)
from gpuslice.config.settings import Settings, load_config, settings_from
from gpuslice.config.v1 import Config
from gpuslice.core.advice import Series, SeriesFacts
from gpuslice.core.cdi import EXTRA_NODES, uses_cdi
from gpuslice.core.container_spec import CONTROL_DEVICES, IMEX_CHANNELS
from gpuslice.core.errors import BackendError, ConfigError
from gpuslice.core.isolation import HostFacts
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import (
    ClaimDir,
    DirEvents,
    DirWatch,
    FrontEnd,
    GpuBackend,
    LabelSink,
    Metrics,
    NodeApi,
    PluginEndpoint,
    PodEvents,
    PodResources,
    ProcessOwners,
    TimeSlicer,
)
from gpuslice.core.response import AllocateOptions
from gpuslice.core.restart import RestartBudget
from gpuslice.core.settings import LabelSettings
from gpuslice.frontends.deviceplugin import DevicePluginFrontEnd, EndpointFactory, ResourceHandler
from gpuslice.frontends.dra.driver import DraDriver
from gpuslice.frontends.dra.frontend import DraFrontEnd
from gpuslice.frontends.dra.publisher import SlicePublisher
from gpuslice.services.agent import Agent
from gpuslice.services.cdi import CdiSpecs
from gpuslice.services.claim_shares import ClaimShares
from gpuslice.services.config_manager import ConfigManager, NoCluster, NodeLabelSource
from gpuslice.services.config_source import (
    ConfigMapEntries,
    DirectoryEntries,
    EntrySource,
    FileEntries,
)
from gpuslice.services.isolation import NO_LIMITS, Isolation
from gpuslice.services.labeller import NodeFeatureSink
from gpuslice.services.labels_node import LabelsNode
from gpuslice.services.mps import MPS_WAITING_REASON, MpsDaemons
from gpuslice.services.node import Apply, LabelOptions, Node, NodeDeps
from gpuslice.services.node_devices import NodeDevices
from gpuslice.services.node_metrics import node_state
from gpuslice.services.sampler import Sampler
from gpuslice.services.watchdog import Watchdog

if TYPE_CHECKING:
    from gpuslice.adapters.metrics import PrometheusMetrics
    from gpuslice.adapters.podresources import PodResourcesClient
    from gpuslice.adapters.status_http import Authorize, StatusServer
    from gpuslice.testing.cgroups import CgroupTree, r615_node
    from gpuslice.testing.configmap import write_configmap_volume
    from gpuslice.testing.kubelet import KubeletStandin
    from gpuslice.testing.kubelet.records import (
        AdmittedContainer,
        InsufficientResourceError,
        StandinError,
    )
    from gpuslice.testing.nodeapi import MemoryNodeApi
    from gpuslice.testing.prometheus import SyntheticPrometheus

# The simulated cluster `gpuslice demo` runs against (the testing kit), loaded when used.
_KIT = {
    "CgroupTree": "gpuslice.testing.cgroups",
    "r615_node": "gpuslice.testing.cgroups",
    "write_configmap_volume": "gpuslice.testing.configmap",
    "KubeletStandin": "gpuslice.testing.kubelet",
    "AdmittedContainer": "gpuslice.testing.kubelet.records",
    "InsufficientResourceError": "gpuslice.testing.kubelet.records",
    "StandinError": "gpuslice.testing.kubelet.records",
    "MemoryNodeApi": "gpuslice.testing.nodeapi",
    "SyntheticPrometheus": "gpuslice.testing.prometheus",
}


def __getattr__(name: str) -> object:
    if name in _KIT:
        return getattr(importlib.import_module(_KIT[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AdmittedContainer",
    "CgroupTree",
    "InsufficientResourceError",
    "KubeletStandin",
    "MemoryNodeApi",
    "Node",
    "RunOptions",
    "StandinError",
    "SyntheticPrometheus",
    "r615_node",
    "resolve_options",
    "write_configmap_volume",
]


@dataclass(frozen=True)
class Parts:
    """The adapters a node's agent is built from, as `run` picks them (wiring.parts); a
    test or the bench may swap one (dataclasses.replace) before building."""

    open_backend: Callable[[], GpuBackend]  # raises BackendError when NVML cannot start
    endpoint: EndpointFactory  # one device-plugin endpoint per resource
    watch: DirWatch | None  # the device-plugin directory's watch (None: not followed)
    plugin_dir: str
    restart_budget: RestartBudget | None = None  # None: upstream's (5 restarts an hour)
    # Takes the device-plugin directory from a predecessor just before serving, and hands
    # it to a successor on the way out (None: not claimed here, as in tests of parts).
    claim_dir: ClaimDir | None = None


def parts(opts: RunOptions, metrics: Metrics = NO_METRICS) -> Parts:
    """The adapters of `opts`: NVML or the simulated node, the kubelet's directory."""
    plugin_dir, kubelet_socket = opts.plugin_dir, opts.kubelet_socket

    def endpoint(handler: ResourceHandler) -> PluginEndpoint:
        return KubeletEndpoint.create(handler, plugin_dir, kubelet_socket, metrics)

    return Parts(
        open_backend=lambda: open_backend(opts),
        endpoint=endpoint,
        watch=_watch if kubelet_socket else None,
        plugin_dir=plugin_dir,
    )


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

    return existing_channels(IMEX_CHANNELS, roots=("/", opts.driver_root_ctr_path))


def plugin_settings(loaded: LoadedConfig, opts: RunOptions) -> Settings:
    """The settings of one loaded config under the device plugin's start-up rules."""
    return settings_from(loaded, opts, imex_present=imex_present(opts))


def open_backend(opts: RunOptions) -> GpuBackend:
    """The simulated backend when one is named, NVML otherwise (BackendError if absent)."""
    if opts.fake_hardware:
        from gpuslice.adapters.fake import FakeBackend

        return FakeBackend.from_spec(opts.fake_hardware, opts.fake_events)
    from gpuslice.adapters.nvml import NvmlBackend

    return NvmlBackend.open(driver_root=opts.driver_root_ctr_path or "/driver-root")


def _watch(path: str, names: Collection[str] | None) -> DirEvents:
    return DirWatcher(path, names)


def _config_watch(path: str, names: Collection[str] | None) -> DirEvents:
    return DirWatcher(path, names, poll_interval=0.5)


def time_slicer(opts: RunOptions) -> TimeSlicer:
    """The GPUs' compute-policy time slice: simulated beside the fake events file, else
    nvidia-smi's."""
    if opts.fake_hardware:
        from gpuslice.adapters.fake.time_slices import FakeTimeSlices

        return FakeTimeSlices(opts.fake_events or None)
    from gpuslice.adapters.nvml.time_slices import NvidiaSmiTimeSlices

    return NvidiaSmiTimeSlices()


def control_devices(opts: RunOptions) -> tuple[str, ...]:
    if opts.fake_hardware:
        return ()
    return tuple(p for p in CONTROL_DEVICES if os.path.exists(p))


def node_devices(opts: RunOptions, metrics: Metrics, parts: Parts) -> NodeDevices:
    """The node's device state: the backend, CDI specs, MPS daemons, holds."""
    return NodeDevices(
        parts.open_backend,
        cdi=cdi_specs(opts, control_devices(opts)),
        mps=mps_daemons(opts),
        pod_resources=lambda: _held_back_by(opts),
        metrics=metrics,
    )


def device_plugin(
    opts: RunOptions, devices: NodeDevices, metrics: Metrics, parts: Parts
) -> DevicePluginFrontEnd:
    """The device-plugin front-end: one endpoint per resource in the kubelet's directory
    (with DRA on, only those --dra-device-plugin-resources names)."""
    return DevicePluginFrontEnd(
        devices,
        parts.endpoint,
        parts.plugin_dir,
        watch=parts.watch,
        control_devices=control_devices(opts),
        budget=parts.restart_budget,
        claim_dir=parts.claim_dir,
        metrics=metrics,
        kept=opts.dra_device_plugin_resources if opts.dra is not None else None,
    )


def dra_front_end(
    opts: RunOptions, devices: NodeDevices, shares: ClaimShares | None = None
) -> DraFrontEnd:
    """The DRA front-end (--dra): its sockets in the kubelet's plugin directories, its
    checkpoint beside its socket, a CDI spec per claim and the NVIDIA Container Toolkit's
    devices from the CDI directory, ResourceSlices and ResourceClaims through the API.
    Raises ConfigError when it cannot be served."""
    dra = opts.dra
    assert dra is not None
    if not opts.node_name or not (opts.kubeconfig or opts.in_cluster):
        raise ConfigError(NO_API_FOR_DRA)
    if not opts.cdi_spec_dir:
        raise ConfigError(
            "--dra (GPUSLICE_DRA): a DRA claim's devices reach its containers only through "
            "CDI; set --cdi-spec-dir (CDI_SPEC_DIR) to the runtime's CDI directory"
        )
    from gpuslice.adapters.cdi_file import find_toolkit_devices
    from gpuslice.adapters.dra.checkpoint import ClaimCheckpointFile
    from gpuslice.adapters.dra.claim_specs import ClaimSpecDir
    from gpuslice.adapters.dra.server import DraServer
    from gpuslice.adapters.kube.dra_api import KubeDraApi

    api = KubeDraApi(kubeconfig=opts.kubeconfig or None)
    plugin_dir = os.path.join(opts.dra_plugins_dir, dra.driver)
    driver = DraDriver(
        node=opts.node_name,
        opts=dra,
        view=devices,
        api=api,
        checkpoint=ClaimCheckpointFile(plugin_dir),
        specs=ClaimSpecDir(opts.cdi_spec_dir),
        control_devices=control_devices(opts),
        shares=shares,
        time_slicer=time_slicer(opts),
    )
    return DraFrontEnd(
        devices,
        driver,
        SlicePublisher(api, node=opts.node_name, opts=dra),
        DraServer(driver, registry_dir=opts.dra_registry_dir, plugin_dir=plugin_dir),
        device_plugin=opts.dra_device_plugin_resources,
        find_toolkit=partial(find_toolkit_devices, toolkit_dirs(opts)),
        on_stop=api.aclose,
    )


def agent(
    opts: RunOptions, metrics: Metrics = NO_METRICS, with_parts: Parts | None = None
) -> Agent:
    """The converge loop over the node's devices and its front-ends: the device plugin,
    and DRA with --dra."""
    chosen = with_parts or parts(opts, metrics)
    devices = node_devices(opts, metrics, chosen)
    front_ends: list[FrontEnd] = [device_plugin(opts, devices, metrics, chosen)]
    if opts.dra is not None:
        shares = ClaimShares() if opts.memory_isolation else None
        front_ends.append(dra_front_end(opts, devices, shares))
    return Agent(devices, front_ends, metrics=metrics)


def mps_binary(opts: RunOptions) -> list[str]:
    """The MPS control binary: the simulated one on simulated hardware unless
    --mps-control-binary names one."""
    binary = [opts.mps_control_binary]
    if opts.fake_hardware and binary[0] == DEFAULT_MPS_CONTROL:
        binary = [sys.executable, "-m", "gpuslice.testing.mps_control"]
    return binary


def mps_daemons(opts: RunOptions) -> MpsDaemons:
    """MPS control daemons (started only for MPS resources): from `gpuslice mps-control`
    when --mps-control-socket names it, else from the agent itself."""
    from gpuslice.adapters.mps import ControlCommands, LocalLauncher, RemoteLauncher

    binary, socket = mps_binary(opts), opts.mps_control_socket
    return MpsDaemons(
        RemoteLauncher(socket) if socket else LocalLauncher(binary),
        ControlCommands(binary),
        pinned_limit_mib=opts.mps_pinned_memory_limit_mib,
        roots=(opts.mps_root,),
    )


@contextlib.asynccontextmanager
async def _held_back_by(opts: RunOptions) -> AsyncIterator[PodResources]:
    """PodResources for holding back moved devices (services.holds), accounting or not:
    a short timeout, since the agent reads it before serving each config."""
    from gpuslice.adapters.podresources import PodResourcesClient

    checkpoint = os.path.join(opts.plugin_dir, "kubelet_internal_checkpoint")
    client = PodResourcesClient(
        opts.pod_resources_socket,
        checkpoint,
        timeout_s=2.0,
        kubelet_socket=opts.kubelet_socket,
    )
    try:
        yield client
    finally:
        await client.aclose()


def cdi_specs(opts: RunOptions, control: tuple[str, ...]) -> CdiSpecs | None:
    """The CDI spec writer (None: --cdi-spec-dir is empty). It is always wired, since a
    reload may switch to a cdi-* strategy, and writes nothing under the others."""
    if not opts.cdi_spec_dir:
        return None
    from gpuslice.adapters.cdi_file import (
        CdiSpecDir,
        find_toolkit_devices,
        is_spec_name,
        present_nodes,
    )

    extra = {} if opts.fake_hardware else {k: present_nodes(v) for k, v in EXTRA_NODES.items()}
    dirs = toolkit_dirs(opts)
    return CdiSpecs(
        CdiSpecDir(opts.cdi_spec_dir),
        control_devices=control,
        extra_nodes=extra,
        find_toolkit=partial(find_toolkit_devices, dirs),
        toolkit_dirs=dirs,
        watch=_cdi_watch,
        is_spec=is_spec_name,
    )


def toolkit_dirs(opts: RunOptions) -> tuple[str, ...]:
    """Where the NVIDIA Container Toolkit's CDI spec is looked for, in the runtimes' order
    of precedence: the dynamic directory (--cdi-spec-dir), then the static one."""
    return tuple(dict.fromkeys(d for d in (opts.cdi_spec_dir, opts.cdi_static_dir) if d))


def _cdi_watch(path: str, names: Collection[str] | None) -> DirEvents:
    """A CDI directory: not through a link, polled twice a second where inotify fails."""
    return DirWatcher(path, names, poll_interval=0.5, follow=False)


def toolkit_problem(opts: RunOptions, allocate: AllocateOptions) -> str | None:
    """Under a cdi-* strategy: why the NVIDIA Container Toolkit's spec is not found."""
    if not opts.cdi_spec_dir or not uses_cdi(allocate):
        return None
    from gpuslice.adapters.cdi_file import find_toolkit_devices

    return find_toolkit_devices(toolkit_dirs(opts)).problem


def node_api(opts: RunOptions) -> NodeApi | None:
    """The Kubernetes API for this node when there is one to talk to."""
    if not opts.node_name or not (opts.kubeconfig or opts.in_cluster):
        return None
    from gpuslice.adapters.kube import KubeNodeApi

    return KubeNodeApi(
        kubeconfig=opts.kubeconfig or None,
        pod_name=opts.pod_name or None,
        host=opts.node_name,
    )


def build_node(
    opts: RunOptions,
    api: NodeApi | None,
    metrics: Metrics = NO_METRICS,
    with_parts: Parts | None = None,
    accounting: (
        Callable[[NodeDevices, Isolation | None], tuple[Sampler, Watchdog | None]] | None
    ) = None,
) -> Node:
    """`gpuslice run`'s node: the agent, the config manager (over the config file or the
    per-node configs), the labeller when configured. Raises ConfigError (the config file
    is read here, once: its first load is the one served first)."""
    entries = config_entries(opts, api)
    first: tuple[LoadedConfig, Settings] | None = None
    if entries is None:
        loaded = load_config(opts)
        first = (loaded, plugin_settings(loaded, opts))
        entries = FileEntries(loaded.source, lambda: load_config(opts), first=loaded)
    source: NodeLabelSource = api if api is not None else NoCluster()

    def to_settings(loaded: LoadedConfig) -> Settings:
        if first is not None and loaded is first[0]:
            return first[1]  # resolved above: one resolve per load
        return plugin_settings(loaded, opts)

    def manager(apply: Apply) -> ConfigManager[Settings]:
        assert entries is not None
        return ConfigManager(
            source,
            opts.node_name,
            entries,
            to_settings,
            apply,
            label=opts.node_label if first is None else None,
            default=opts.default_config or None,
            fallbacks=opts.fallback_strategies,
            metrics=metrics,
        )

    labels = None
    if opts.labels == "true" or (opts.labels == "auto" and api is not None):
        # Per-node configs are chosen later: there only flags, env vars and defaults count.
        gfd = first[1].labels if first else label_settings_of(opts, LoadedConfig(Config()))
        labels = label_output(opts, api, gfd)
    node_agent = agent(opts, metrics, with_parts)
    mps = node_agent.node.mps
    if mps is not None and api is not None and opts.node_name:
        # New MPS replicas withheld while an old daemon's clients finish: on the Node.
        async def mps_waiting(message: str) -> None:
            await api.record_event(opts.node_name, MPS_WAITING_REASON, message, warning=True)

        mps.notify = mps_waiting
    claims = next(
        (f.driver.shares for f in node_agent.front_ends if isinstance(f, DraFrontEnd)), None
    )
    deps = NodeDeps(node_agent, manager, labels, accounting, isolation(opts, claims))
    if api is not None:
        deps.watch_trouble = lambda: api.watch_trouble
    return Node(deps)


CHECKPOINT = "kubelet_internal_checkpoint"


def isolation_facts(opts: RunOptions, backend: GpuBackend) -> HostFacts:
    """What decides each GPU's memory isolation: the driver's answer and the host's
    cgroup tree under --cgroup-root (`gpuslice inspect`)."""
    from gpuslice.adapters.cgroup_tree import PodCgroupTree

    limits = getattr(backend, "limit_problem", None)
    problem = limits() if callable(limits) else NO_LIMITS
    return PodCgroupTree(opts.cgroup_root).facts(str(problem))


def isolation(
    opts: RunOptions, claims: ClaimShares | None = None
) -> Callable[[NodeDevices], Isolation] | None:
    """Per-pod GPU memory limits (--memory-isolation): the host's pod cgroups under
    --cgroup-root, the kubelet's device checkpoint and the DRA front-end's prepared
    claims (`claims`) for who holds which share."""
    if not opts.memory_isolation:
        return None
    from gpuslice.adapters.cgroup_tree import PodCgroupTree
    from gpuslice.adapters.podresources import read_checkpoint

    tree = PodCgroupTree(opts.cgroup_root)
    path = os.path.join(opts.plugin_dir, CHECKPOINT)

    def build(devices: NodeDevices) -> Isolation:
        return Isolation(
            devices,
            tree,
            lambda: read_checkpoint(path),
            _watch,
            also_watch=((opts.plugin_dir, frozenset({CHECKPOINT})),),
            claims=claims,
        )

    return build


def label_settings_of(opts: RunOptions, loaded: LoadedConfig) -> LabelSettings:
    return settings_from(loaded, opts).labels


def config_entries(opts: RunOptions, api: NodeApi | None) -> EntrySource | None:
    """Where the per-node configs come from: the ConfigMap through the API, a mounted
    directory, or None (one config file). Raises ConfigError naming what is missing."""
    if not opts.per_node:
        return None
    if not opts.config_map:
        return DirectoryEntries(opts.config_dir, _config_watch)
    if api is None:
        raise ConfigError(NO_API_FOR_CONFIG_MAP.format(name=opts.config_map))
    return ConfigMapEntries(api, opts.namespace, opts.config_map)


def label_output(opts: RunOptions, api: NodeApi | None, gfd: LabelSettings) -> LabelOptions:
    """Where labels go and how often: the NodeFeature object through the API, or a
    features.d file. Raises ConfigError when the NodeFeature API is asked for and there is
    no cluster to publish to."""
    sink: LabelSink
    if gfd.use_node_feature_api:
        if api is None or not opts.node_name:
            raise ConfigError(NO_API_FOR_NODE_FEATURES)
        sink = NodeFeatureSink(api, opts.node_name, opts.namespace)
    else:
        from gpuslice.adapters.nfd_file import FeatureFile

        sink = FeatureFile(gfd.output_file)
    return LabelOptions(
        sinks=[sink],
        interval_s=gfd.interval_s,
        timestamps=gfd.timestamps,
        machine=machine_type(opts, gfd.machine_type_file),
        oneshot=gfd.oneshot,
    )


MACHINE_TYPE_MAX_BYTES = 64 * 1024  # sysfs reports a page; a name is a line


def machine_type(opts: RunOptions, path: str) -> str | None:
    """The machine type from `path`; None (the snapshot's own) when unreadable, and on
    simulated hardware unless a file other than the default is named (the host's DMI
    name would otherwise replace the simulated node's)."""
    if opts.fake_hardware and path == DEFAULT_MACHINE_TYPE_FILE:
        return None
    try:  # a regular file of a machine's name, read without blocking or growing
        return read_text(path, limit=MACHINE_TYPE_MAX_BYTES, errors="replace").strip() or None
    except OSError:
        return None


def lock_holder(opts: RunOptions) -> Holder:
    """Who this agent is, for another agent waiting on the device-plugin directory."""
    return Holder(
        os.getpid(),
        opts.pod_name,
        opts.node_name,
        socket.gethostname(),
        token=secrets.token_hex(8),
    )


async def run_node(opts: RunOptions, stop: asyncio.Event, reload: asyncio.Event) -> None:
    """`gpuslice run`: the whole agent until `stop`, with the probe endpoint if asked.
    It serves once the device-plugin directory exists and no other agent holds it."""
    own_dir = None
    if not opts.kubelet_socket:  # not registering: nothing of the kubelet's is used
        own_dir = tempfile.mkdtemp(prefix="gpuslice-plugins-")
        opts = dataclasses.replace(opts, own_plugin_dir=own_dir)
    api = node_api(opts)
    try:
        address, metrics_address = opts.status_address, opts.metrics_address
        metrics = prometheus_metrics(opts) if address or metrics_address else None
        pods = pod_resources(opts)
        sampling = None if pods is None else accounting(opts, api, metrics or NO_METRICS, pods)
        chosen = parts(opts, metrics or NO_METRICS)
        if own_dir is None:  # the node's directory: one agent at a time
            claim_dir: ClaimDir = lambda stop, waiting: _claim(opts, stop, waiting)  # noqa: E731
            chosen = dataclasses.replace(chosen, claim_dir=claim_dir)
        node = build_node(opts, api, metrics or NO_METRICS, chosen, accounting=sampling)
        async with contextlib.AsyncExitStack() as stack:
            if pods is not None:
                stack.push_async_callback(pods.aclose)
            if metrics is not None:
                _watch_node(metrics, node)
            for server in _http_servers(opts, api, node, metrics):
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
    opts: RunOptions, api: NodeApi | None, node: Node, metrics: PrometheusMetrics | None
) -> list[StatusServer]:
    """The probes on the status address (and its socket), with /metrics there too unless it
    has its own address; /metrics behind the API's token check with --metrics-auth."""
    from gpuslice.adapters.status_http import METRICS_NAME, SharedRender, StatusServer

    address, metrics_address = opts.status_address, opts.metrics_address
    page = None if metrics is None else SharedRender(metrics.page, metrics.prepare)
    authorize = metrics_auth(opts, api) if page is not None else None
    servers = []
    if address:
        servers.append(StatusServer(address, node.readiness, None if metrics_address else page,
                                    authorize=authorize, unix_path=opts.status_socket))  # fmt: skip
    if metrics_address:
        servers.append(
            StatusServer(metrics_address, None, page, name=METRICS_NAME, authorize=authorize)
        )
    return servers


def metrics_auth(opts: RunOptions, api: NodeApi | None) -> Authorize | None:
    """The bearer-token check of /metrics (--metrics-auth kubernetes), over the node's API."""
    if opts.metrics_auth != "kubernetes":
        return None
    from gpuslice.adapters.kube import KubeNodeApi

    if not isinstance(api, KubeNodeApi):
        raise BackendError(
            "--metrics-auth (GPUSLICE_METRICS_AUTH) kubernetes needs the Kubernetes API: "
            "set --node-name (NODE_NAME) and run in a cluster or give --kubeconfig"
        )
    return api.metrics_auth().verdict


async def _claim(
    opts: RunOptions, stop: asyncio.Event, waiting: Callable[[str], None]
) -> DirClaim | None:
    """The device-plugin directory, once no other agent holds it."""
    lock = await claim(opts.plugin_dir, lock_holder(opts), stop, waiting)
    return None if lock is None else DirClaim(lock)


def prometheus_metrics(opts: RunOptions) -> PrometheusMetrics:
    """The Prometheus adapter, imported only for an agent serving /metrics."""
    from gpuslice.adapters.metrics import PrometheusMetrics

    return PrometheusMetrics(hostname=opts.node_name or socket.gethostname())


def _watch_node(metrics: PrometheusMetrics, node: Node) -> None:
    """Series read from the node at each scrape: resources, GPUs, the config."""
    from gpuslice.adapters.metrics import NodeStateCollector

    plugin = device_plugin_of(node)
    collect = lambda: node_state(node, plugin.resource_states)  # noqa: E731
    metrics.add(NodeStateCollector(collect, hostname=metrics.hostname))
    if node.isolation is not None:
        from gpuslice.adapters.metrics import IsolationCollector

        metrics.add(IsolationCollector(node.isolation.view, hostname=metrics.hostname))
    sampler, watchdog = node.sampler, node.watchdog
    if sampler is not None:
        from gpuslice.adapters.metrics import AccountingCollector, BudgetCollector

        metrics.add(AccountingCollector(lambda: sampler.latest, hostname=metrics.hostname))
        if watchdog is not None:
            metrics.add(BudgetCollector(lambda: watchdog.latest, hostname=metrics.hostname))


def device_plugin_of(node: Node) -> DevicePluginFrontEnd:
    """The node's device-plugin front-end."""
    (plugin,) = (f for f in node.agent.front_ends if isinstance(f, DevicePluginFrontEnd))
    return plugin


def pod_resources(opts: RunOptions) -> PodResourcesClient | None:
    """The kubelet's PodResources API and device checkpoint (None: accounting is off).
    Nothing connects until the first sample, and none while no kubelet is there: a missing
    socket fails samples, not the agent."""
    if not opts.accounting:
        return None
    from gpuslice.adapters.podresources import PodResourcesClient

    checkpoint = os.path.join(opts.plugin_dir, "kubelet_internal_checkpoint")
    return PodResourcesClient(
        opts.pod_resources_socket, checkpoint, kubelet_socket=opts.kubelet_socket
    )


def accounting(
    opts: RunOptions, api: NodeApi | None, metrics: Metrics, pods: PodResources
) -> Callable[[NodeDevices, Isolation | None], tuple[Sampler, Watchdog | None]]:
    """The sampler beside the agent and the memory-budget watchdog it feeds. On simulated
    hardware the backend knows its processes' pods; on a node, their cgroups under
    --proc-root do."""
    owners: ProcessOwners | None = None
    kill = _kill  # simulated: the events file says which pod a PID is in
    if not opts.fake_hardware:
        from gpuslice.adapters.cgroups import CgroupOwners

        cgroups = CgroupOwners(opts.proc_root)
        owners, kill = cgroups, cgroups.kill
    events = cast(PodEvents, api) if hasattr(api, "record_pod_event") else None

    def build(devices: NodeDevices, limits: Isolation | None) -> tuple[Sampler, Watchdog | None]:
        watchdog = Watchdog(
            opts.memory_budget_policy,
            opts.memory_budgets,
            lambda: devices.snapshot,
            hold=lambda held: devices.hold(held, by="watchdog"),
            kill=kill,
            events=events,
            metrics=metrics,
            enforced=limits.enforced if limits is not None else frozenset,
        )
        sampler = Sampler(
            devices.on_backend,
            lambda: devices.snapshot,
            pods,
            owners,
            interval_s=opts.sample_interval_s,
            sampled=metrics.sampled,
            failed=metrics.sample_failed,
            after=watchdog.check,
            cgroup_used=limits.usage if limits is not None else None,
        )
        return sampler, watchdog

    return build


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


# --- gpuslice labels -------------------------------------------------------------------


def labels_node(opts: RunOptions, api: NodeApi | None) -> LabelsNode:
    """`gpuslice labels`: the labeller over the node's backend and the config file,
    without a front-end. Raises ConfigError for a bad config or flag (read here, once)."""
    loaded = load_config(opts)
    first = settings_from(loaded, opts)
    entries = FileEntries(loaded.source, lambda: load_config(opts), first=loaded)

    def to_settings(loaded_now: LoadedConfig) -> Settings:
        return first if loaded_now is loaded else settings_from(loaded_now, opts)

    def manager(apply: Apply) -> ConfigManager[Settings]:
        return ConfigManager(NoCluster(), opts.node_name, entries, to_settings, apply, label=None)

    devices = NodeDevices(lambda: open_backend(opts))
    output = label_output(opts, api, first.labels)
    pinned = opts.mps_pinned_memory_limit_mib
    return LabelsNode(devices, manager, output, first, pinned_limit_mib=pinned)


async def run_labels(
    opts: RunOptions, stop: asyncio.Event, reload: asyncio.Event | None = None
) -> None:
    """Label until `stop` (once when oneshot). Raises GpusliceError for a bad config or
    flag, a backend that cannot start (unless failOnInitError is false) and, in oneshot
    mode, a labelling or output that fails."""
    api = node_api(opts)
    try:
        await labels_node(opts, api).run(stop, reload)
    finally:
        if api is not None:
            await api.aclose()


def prometheus_facts(
    url: str, *, end: float, window_s: float, step_s: float, namespace: str = ""
) -> dict[Series, SeriesFacts]:
    """The agent's per-container series over the window, read from Prometheus' API
    (`gpuslice advise`); PrometheusError (a GpusliceError) when it cannot be read."""
    from gpuslice.adapters.prometheus import PrometheusApi, gather

    return gather(PrometheusApi(url), end, window_s, step_s, namespace)


def mig_profiles() -> dict[str, dict[str, int]]:
    """GPU model name -> MIG profile -> memory (MiB), from the simulated models."""
    from gpuslice.adapters.fake.models import MODELS

    return {
        m.name: {name: p.memory_mib for name, p in m.mig_profiles.items()}
        for m in MODELS.values()
        if m.mig_profiles
    }
