"""`gpuslice run`'s node: the agent, the config follower, the labeller, accounting and
memory isolation, over the Kubernetes API when there is one."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.config.loader import LoadedConfig
from gpuslice.config.options import NO_API_FOR_CONFIG_MAP, NO_API_FOR_NODE_FEATURES, RunOptions
from gpuslice.config.settings import Settings, load_config, settings_from
from gpuslice.config.v1 import Config
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import ConfigError
from gpuslice.core.isolation import HostFacts
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import (
    DirEvents,
    GpuBackend,
    Host,
    LabelSink,
    Metrics,
    NodeApi,
    PodCgroups,
    PodEvents,
    PodResources,
)
from gpuslice.core.settings import LabelSettings
from gpuslice.core.sharing import ResourceSettings
from gpuslice.services.claim_shares import ClaimShares
from gpuslice.services.config_manager import (
    ConfigChoice,
    ConfigInputs,
    ConfigManager,
    NoCluster,
    NodeLabelSource,
)
from gpuslice.services.config_source import (
    ConfigMapEntries,
    DirectoryEntries,
    EntrySource,
    FileEntries,
)
from gpuslice.services.isolation import Isolation, limit_problem
from gpuslice.services.labeller import Labeller, LabelPolicy, NodeFeatureSink, snapshot_labels
from gpuslice.services.mps import MPS_WAITING_REASON, Notify
from gpuslice.services.node import Apply, LabelOptions, Node, NodeParts, serve_config
from gpuslice.services.node_devices import NodeDevices
from gpuslice.services.sampler import SampleHooks, Sampler, SampleSources, owners_of
from gpuslice.services.watchdog import Watchdog
from gpuslice.wiring.agent import CHECKPOINT, Parts, agent, parts, watch
from gpuslice.wiring.host import plugin_settings

if TYPE_CHECKING:
    from gpuslice.adapters.kube import KubeNodeApi
    from gpuslice.services.mig_manager import MigManager

__all__ = [
    "Node",
    "build_node",
    "config_entries",
    "isolation_facts",
    "label_output",
    "node_api",
    "node_config",
    "node_labeller",
    "node_labels",
    "pod_cgroups",
]

Accounting = Callable[[NodeDevices, Isolation | None], tuple[Sampler, Watchdog | None]]


def node_api(opts: RunOptions) -> KubeNodeApi | None:
    """The Kubernetes API for this node when there is one to talk to."""
    if not opts.api.node_name or not (opts.api.kubeconfig or opts.api.in_cluster):
        return None
    from gpuslice.adapters.kube import KubeNodeApi

    return KubeNodeApi(
        kubeconfig=opts.api.kubeconfig or None,
        pod_name=opts.api.pod_name or None,
        host=opts.api.node_name,
    )


def build_node(
    opts: RunOptions,
    api: NodeApi | None,
    metrics: Metrics = NO_METRICS,
    with_parts: Parts | None = None,
    accounting: Accounting | None = None,
) -> Node:
    """`gpuslice run`'s node: the agent, the config manager (over the config file or the
    per-node configs), the labeller when configured. Raises ConfigError (the config file
    is read here, once: its first load is the one served first)."""
    chosen = with_parts or parts(opts, metrics)
    machine = chosen.host
    manager, first = node_config(opts, machine, api, metrics)
    labels = node_labels(opts, machine, api, first)
    shares = ClaimShares() if opts.dra.enabled and opts.isolation.enabled else None
    notify = (
        _mps_waiting(api, opts.api.node_name) if api is not None and opts.api.node_name else None
    )
    node_agent = agent(opts, metrics, chosen, shares=shares, mps_notify=notify)
    devices = node_agent.node
    limits = isolation(opts, machine, devices, shares)
    mig = None
    if opts.device_plugin.mig_parted_config:  # its modules load only then
        from gpuslice.wiring.mig import mig_manager

        mig = mig_manager(opts, api, node_agent)
    labeller = node_labeller(devices, labels, limits, mig) if labels is not None else None
    sampler, watchdog = accounting(devices, limits) if accounting is not None else (None, None)
    return Node(
        NodeParts(
            node_agent,
            manager(serve_config(node_agent, labeller)),
            labeller,
            limits,
            sampler,
            watchdog,
            (lambda: api.watch_trouble) if api is not None else lambda: None,
            mig,
        )
    )


def node_config(
    opts: RunOptions, machine: Host, api: NodeApi | None, metrics: Metrics = NO_METRICS
) -> tuple[Callable[[Apply], ConfigManager[Settings]], Settings | None]:
    """The config manager around the callback that serves a config, and the settings of
    the config file read here (None: per-node configs, chosen later). Raises ConfigError."""
    per_node = config_entries(opts, api)
    first: tuple[LoadedConfig, Settings] | None = None
    if per_node is None:
        loaded = load_config(opts)
        first = (loaded, plugin_settings(loaded, opts, machine))
    entries = per_node or FileEntries(loaded.source, lambda: load_config(opts), first=loaded)
    source: NodeLabelSource = api if api is not None else NoCluster()

    def to_settings(loaded: LoadedConfig) -> Settings:
        if first is not None and loaded is first[0]:
            return first[1]  # resolved above: one resolve per load
        return plugin_settings(loaded, opts, machine)

    def manager(apply: Apply) -> ConfigManager[Settings]:
        return ConfigManager(
            ConfigInputs(source, opts.api.node_name, entries, to_settings),
            apply,
            ConfigChoice(
                label=opts.source.node_label if first is None else None,
                default=opts.source.default or None,
                fallbacks=opts.source.fallbacks,
            ),
            metrics=metrics,
        )

    return manager, first[1] if first is not None else None


def node_labels(
    opts: RunOptions, machine: Host, api: NodeApi | None, first: Settings | None
) -> LabelOptions | None:
    """Where the labels beside the plugin go (None: not labelled), by the config file's
    settings `first`; per-node configs are chosen later: there only flags, env vars and
    defaults count."""
    if not (opts.api.labels == "true" or (opts.api.labels == "auto" and api is not None)):
        return None
    gfd = first.labels if first else settings_from(LoadedConfig(Config()), opts).labels
    return label_output(opts, machine, api, gfd)


def node_labeller(
    devices: NodeDevices, opts: LabelOptions, isolation: Isolation | None, mig: MigManager | None
) -> Labeller:
    """The labeller beside the plugin: the committed hardware and settings' labels, memory
    isolation's where it is on, and the MIG layout's state where it is followed."""

    async def read() -> tuple[HardwareSnapshot, ResourceSettings]:
        return devices.snapshot, devices.settings.resources

    def more() -> dict[str, str]:
        extra = dict(isolation.labels()) if isolation is not None else {}
        return extra | (mig.labels() if mig is not None else {})

    return Labeller(
        snapshot_labels(read, machine=opts.machine, more=more),
        opts.sinks,
        LabelPolicy(interval_s=opts.interval_s, timestamps=opts.timestamps),
    )


def _mps_waiting(api: NodeApi, node: str) -> Notify:
    """New MPS replicas withheld while an old daemon's clients finish: on the Node."""

    async def notify(message: str) -> None:
        await api.record_event(node, MPS_WAITING_REASON, message, warning=True)

    return notify


def pod_cgroups(opts: RunOptions, machine: Host) -> PodCgroups:
    """The pods' cgroups and the cgroup facts under --cgroup-root, as the host sees them
    (the simulated host: its node file's facts unless a tree is named)."""
    return machine.pod_cgroups(opts.isolation.cgroup_root)


def isolation_facts(cgroups: PodCgroups, backend: GpuBackend) -> HostFacts:
    """What decides each GPU's memory isolation: the driver's answer and the cgroup
    facts (`gpuslice inspect`)."""
    return cgroups.facts(limit_problem(backend))


def isolation(
    opts: RunOptions, machine: Host, devices: NodeDevices, claims: ClaimShares | None = None
) -> Isolation | None:
    """Per-pod GPU memory limits (--memory-isolation): the host's pod cgroups under
    --cgroup-root, the kubelet's device checkpoint and the DRA front-end's prepared
    claims (`claims`) for who holds which share."""
    if not opts.isolation.enabled:
        return None
    from gpuslice.adapters.podresources import read_checkpoint

    tree = pod_cgroups(opts, machine)
    path = os.path.join(opts.kubelet.plugin_dir, CHECKPOINT)

    return Isolation(
        devices,
        tree,
        lambda: read_checkpoint(path),
        watch,
        also_watch=((opts.kubelet.plugin_dir, frozenset({CHECKPOINT})),),
        claims=claims,
    )


def _config_watch(path: str, names: Collection[str] | None) -> DirEvents:
    return DirWatcher(path, names, poll_interval=0.5)


def config_entries(opts: RunOptions, api: NodeApi | None) -> EntrySource | None:
    """Where the per-node configs come from: the ConfigMap through the API, a mounted
    directory, or None (one config file). Raises ConfigError naming what is missing."""
    if not opts.source.per_node:
        return None
    if not opts.source.config_map:
        return DirectoryEntries(opts.source.dir, _config_watch)
    if api is None:
        raise ConfigError(NO_API_FOR_CONFIG_MAP.format(name=opts.source.config_map))
    return ConfigMapEntries(api, opts.api.namespace, opts.source.config_map)


def label_output(
    opts: RunOptions, machine: Host, api: NodeApi | None, gfd: LabelSettings
) -> LabelOptions:
    """Where labels go and how often: the NodeFeature object through the API, or a
    features.d file. Raises ConfigError when the NodeFeature API is asked for and there is
    no cluster to publish to."""
    sink: LabelSink
    if gfd.use_node_feature_api:
        if api is None or not opts.api.node_name:
            raise ConfigError(NO_API_FOR_NODE_FEATURES)
        sink = NodeFeatureSink(api, opts.api.node_name, opts.api.namespace)
    else:
        from gpuslice.adapters.nfd_file import FeatureFile

        sink = FeatureFile(gfd.output_file)
    return LabelOptions(
        sinks=[sink],
        interval_s=gfd.interval_s,
        timestamps=gfd.timestamps,
        machine=machine.machine_type(gfd.machine_type_file),
        oneshot=gfd.oneshot,
    )


def accounting(
    opts: RunOptions,
    machine: Host,
    events: PodEvents | None,
    metrics: Metrics,
    pods: PodResources,
) -> Accounting:
    """The sampler beside the agent and the memory-budget watchdog it feeds; the host
    says who owns a GPU process and ends one (the simulated backend: its own)."""
    owners = machine.process_owners()

    def build(devices: NodeDevices, limits: Isolation | None) -> tuple[Sampler, Watchdog | None]:
        def kill_on(backend: GpuBackend, pid: int) -> None:
            found = owners_of(owners, backend)
            if found is None:
                raise ProcessLookupError(pid, "nothing here knows who owns GPU processes")
            found.kill(pid)

        async def kill(pid: int) -> None:
            if owners is not None:
                owners.kill(pid)
            else:
                await devices.on_backend(lambda backend: kill_on(backend, pid))

        watchdog = Watchdog(
            opts.accounting.budget_policy,
            opts.accounting.budgets,
            lambda: devices.snapshot,
            hold=lambda held: devices.hold(held, by="watchdog"),
            kill=kill,
            events=events,
            metrics=metrics,
            enforced=limits.enforced if limits is not None else frozenset,
        )
        used = limits.usage if limits is not None else None
        sampler = Sampler(
            SampleSources(devices.on_backend, lambda: devices.snapshot, pods, owners, used),
            SampleHooks(metrics.sampled, metrics.sample_failed, watchdog.check),
            interval_s=opts.accounting.sample_interval_s,
        )
        return sampler, watchdog

    return build
