"""What one command's line and environment say, resolved once into typed sections.

`resolve_options` makes the one pass over the flag table for a command (flags over env
vars over defaults), parses every value, fills each section from the fields that name
their flags (config.flag_fields), and runs every check across them, so a resolved
`RunOptions` is valid and reading it never raises. The flags that land in the config
file stay in `flags` (applied to each config loaded, once per load: config.settings).
Nothing below the command line reads a flag's name or parses its text; errors here name
the flag and its env var.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpuslice.config.checks import duration_seconds, show
from gpuslice.config.flag_fields import fill, flag_field
from gpuslice.config.flags import FLAGS_BY_NAME, FlagValues, GfdEnv, read_flags
from gpuslice.config.health_env import recovery_from_env, xid_policy_from_env
from gpuslice.core.dra.devices import DraOptions
from gpuslice.core.errors import ConfigError
from gpuslice.core.health import XidPolicy
from gpuslice.core.health_state import RecoveryPolicy
from gpuslice.core.quantity import parse_bytes
from gpuslice.core.watchdog import Policy

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_MPS_CONTROL = str(FLAGS_BY_NAME["mps-control-binary"].default)
DEFAULT_MACHINE_TYPE_FILE = str(FLAGS_BY_NAME["machine-type-file"].default)
DEFAULT_CGROUP_ROOT = str(FLAGS_BY_NAME["cgroup-root"].default)


def _strings(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, tuple) else ()


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


def interval_seconds(text: str) -> float:
    """--sample-interval as seconds; ConfigError naming the flag when it is not a duration."""
    try:
        seconds = duration_seconds(text)
    except ValueError:
        seconds = None
    if seconds is None:
        raise ConfigError(
            f"--sample-interval (GPUSLICE_SAMPLE_INTERVAL): {text!r} is not a positive "
            'duration such as "10s" or "500ms"'
        )
    return seconds


def parse_budgets(text: str) -> dict[str, int]:
    """--memory-budget: "resource=size,resource=size"; ConfigError naming the entry."""
    out: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, size = entry.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError(entry)
            out[name.strip()] = parse_bytes(size)
        except ValueError:
            raise ConfigError(
                f"--memory-budget (GPUSLICE_MEMORY_BUDGET): {entry!r} is not "
                'resource=size, such as "nvidia.com/gpu.shared=10Gi"'
            ) from None
    return out


# The sections are immutable, without a generated __eq__, __hash__ or __repr__: each is
# compiled code the agent would keep, and nothing compares or prints a section.
@dataclass(frozen=True, eq=False, repr=False)
class ConfigSourceOptions:
    """Where the config comes from: one file, or per-node configs (a mounted directory or
    a ConfigMap) picked by the node label, the default or the fallbacks."""

    file: str = flag_field("config-file")
    srcdir: str = flag_field("config-file-srcdir")
    config_map: str = flag_field("config-map")
    default: str = flag_field("default-config")
    node_label: str = flag_field("node-label")
    fallbacks: tuple[str, ...] = flag_field("fallback-strategies", _strings)
    name: str | None = None  # --config-name: one entry of a ConfigMap manifest
    dir: str = ""  # the mounted directory of per-node configs, if any (resolved)
    per_node: bool = False  # the config is chosen per node (resolved)


@dataclass(frozen=True, eq=False, repr=False)
class KubeletOptions:
    socket: str = flag_field("kubelet-socket")  # empty: do not register
    pod_resources_socket: str = flag_field("pod-resources-socket")
    # The device-plugin sockets' directory: the socket's, or with --kubelet-socket "" a
    # private directory of `run`'s (created and removed by it), so the node's is untouched.
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    own_plugin_dir: bool = False  # plugin_dir is that private directory


@dataclass(frozen=True, eq=False, repr=False)
class ApiOptions:
    """Cluster access: this node, its namespace, and how the API is reached."""

    node_name: str = flag_field("node-name")
    namespace: str = flag_field("namespace")
    kubeconfig: str = flag_field("kubeconfig")
    pod_name: str = flag_field("pod-name")
    labels: str = flag_field("labels")  # auto (when in a cluster), true or false
    in_cluster: bool = False  # KUBERNETES_SERVICE_HOST is set


@dataclass(frozen=True, eq=False, repr=False)
class DevicePluginOptions:
    driver_root_ctr_path: str = flag_field("driver-root-ctr-path")  # as given, not the file's
    cdi_spec_dir: str = flag_field("cdi-spec-dir")
    # The static CDI directory, read beside --cdi-spec-dir for the toolkit's spec.
    cdi_static_dir: str = "/etc/cdi"
    mig_parted_config: str = flag_field("mig-parted-config")  # the layouts mig.config names


@dataclass(frozen=True, eq=False, repr=False)
class DraSection:
    enabled: bool = flag_field("dra")
    driver: str = flag_field("dra-driver-name")
    consumable_shares: bool = flag_field("dra-consumable-shares")
    taint_unhealthy: bool = flag_field("dra-taint-unhealthy")
    mig_devices: bool = flag_field("dra-mig-devices")
    dynamic_mig: bool = flag_field("dra-dynamic-mig")  # partitionable MIG devices
    # kept on the device-plugin API
    device_plugin_resources: frozenset[str] = flag_field(
        "dra-device-plugin-resources", lambda v: frozenset(_strings(v))
    )
    plugins_dir: str = flag_field("dra-plugins-dir")  # DRA socket, checkpoint: <this>/<driver>
    registry_dir: str = flag_field("dra-registry-dir")

    @property
    def served(self) -> DraOptions | None:
        """How DRA is served; None: it is not (--dra)."""
        if not self.enabled:
            return None
        return DraOptions(
            driver=self.driver,
            consumable_shares=self.consumable_shares,
            taint_unhealthy=self.taint_unhealthy,
            mig_devices=self.mig_devices,
            dynamic_mig=self.dynamic_mig,
        )


@dataclass(frozen=True, eq=False, repr=False)
class MpsOptions:
    control_binary: str = flag_field("mps-control-binary")
    control_socket: str = flag_field("mps-control-socket")  # empty: daemons started here
    root: str = flag_field("mps-root")  # as given, not the file's: where past daemons may run
    pinned_memory_limit_mib: int = flag_field("mps-pinned-memory-limit", _count)


@dataclass(frozen=True, eq=False, repr=False)
class IsolationOptions:
    enabled: bool = flag_field("memory-isolation")
    cgroup_root: str = flag_field("cgroup-root")


@dataclass(frozen=True, eq=False, repr=False)
class StatusOptions:
    address: str = flag_field("status-address")  # /healthz, /readyz (and /metrics); "": off
    metrics_address: str = flag_field("metrics-address")  # /metrics alone; "": on address
    metrics_auth: str = flag_field("metrics-auth")  # none | kubernetes (Token/SubjectAccess)
    socket: str = flag_field("status-socket")  # a unix socket serving the same


@dataclass(frozen=True, eq=False, repr=False)
class AccountingOptions:
    enabled: bool = flag_field("accounting")
    proc_root: str = flag_field("proc-root")
    sample_interval_s: float = flag_field("sample-interval", interval_seconds)
    budgets: Mapping[str, int] = flag_field("memory-budget", parse_budgets)
    budget_policy: Policy = flag_field("memory-budget-policy", Policy)


SECTIONS = (
    ConfigSourceOptions,
    KubeletOptions,
    ApiOptions,
    DevicePluginOptions,
    DraSection,
    MpsOptions,
    IsolationOptions,
    StatusOptions,
    AccountingOptions,
)


@dataclass(frozen=True)
class RunOptions:
    """One command's settings outside the config file, in typed sections, and the flags
    for the config. Build it with resolve_options: its sections are checked together."""

    flags: FlagValues  # every flag given, parsed (config.flags.apply_flags per load)
    source: ConfigSourceOptions = field(default_factory=ConfigSourceOptions)
    kubelet: KubeletOptions = field(default_factory=KubeletOptions)
    api: ApiOptions = field(default_factory=ApiOptions)
    device_plugin: DevicePluginOptions = field(default_factory=DevicePluginOptions)
    dra: DraSection = field(default_factory=DraSection)
    mps: MpsOptions = field(default_factory=MpsOptions)
    isolation: IsolationOptions = field(default_factory=IsolationOptions)
    status: StatusOptions = field(default_factory=StatusOptions)
    accounting: AccountingOptions = field(default_factory=AccountingOptions)
    fake_hardware: str | None = None  # a simulated node instead of NVML
    fake_events: str | None = None  # its JSON-lines file of injected health events
    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)


_NO_NODE_NAME = (
    "{given} {path}: per-node configs need this node's name to read its label; set "
    "--node-name or NODE_NAME (usually from the downward API, fieldPath spec.nodeName), "
    "otherwise every node would serve the default config"
)
# Errors raised where what a command needs is missing, naming the flags to set.
NO_API_FOR_CONFIG_MAP = (
    "--config-map (CONFIG_MAP) {name}: the ConfigMap is read through the Kubernetes API, "
    "and there is none: run in a cluster or set --kubeconfig (KUBECONFIG)"
)
NO_API_FOR_DRA = (
    "--dra (GPUSLICE_DRA): DRA publishes this node's ResourceSlices and reads claims through "
    "the Kubernetes API: set --node-name (NODE_NAME) and run in a cluster or set --kubeconfig "
    "(KUBECONFIG)"
)
NO_API_FOR_MIG = (
    "--mig-parted-config (MIG_PARTED_CONFIG_FILE) follows the node label nvidia.com/mig.config "
    "through the Kubernetes API: set --node-name (NODE_NAME) and run in a cluster or give "
    "--kubeconfig"
)
BOTH_CHANGE_LAYOUTS = (
    "--mig-parted-config (MIG_PARTED_CONFIG_FILE) and --dra-dynamic-mig (GPUSLICE_DRA_DYNAMIC_MIG) "
    "both change MIG layouts, and each would undo the other's changes: choose one"
)
NO_API_FOR_NODE_FEATURES = (
    "useNodeFeatureAPI is true but there is no Kubernetes API to publish the NodeFeature "
    "object to: set --node-name (NODE_NAME) and --kubeconfig (or run in a cluster), or "
    "pass --use-node-feature-api=false to write a features file"
)


def resolve_options(
    cli_values: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    command: str | None = None,
    config_name: str | None = None,
    fake_hardware: str | None = None,
    fake_events: str | None = None,
) -> RunOptions:
    """The one resolution of a command's flags (`cli_values`: those given on the command
    line, as strings) and env vars (a GfdEnv reads GFD_ names first; with a `command`,
    only the env vars of the flags it takes count), every check included. Raises
    ConfigError naming the flag or env var."""
    env = {} if env is None else env
    flags = read_flags(cli_values or {}, env, command)
    api = fill(ApiOptions, flags, in_cluster=bool(env.get("KUBERNETES_SERVICE_HOST")))
    source = fill(ConfigSourceOptions, flags, name=config_name)
    if command in (None, "run"):  # only `run` follows per-node configs
        source = _per_node(source, api)
    opts = RunOptions(
        flags,
        source=source,
        kubelet=_kubelet(fill(KubeletOptions, flags), command),
        api=api,
        device_plugin=fill(DevicePluginOptions, flags),
        dra=fill(DraSection, flags),
        mps=fill(MpsOptions, flags),
        isolation=fill(IsolationOptions, flags),
        status=fill(StatusOptions, flags),
        accounting=fill(AccountingOptions, flags),
        fake_hardware=fake_hardware,
        fake_events=fake_events,
        xid_policy=xid_policy_from_env(env),
        recovery=recovery_from_env(env),
    )
    if command != "inspect":  # inspect shows what DRA would publish, with no cluster
        _check_dra(opts)
    if command in (None, "run"):
        _check_mig_layouts(opts)
    return opts


def _check_mig_layouts(opts: RunOptions) -> None:
    """Raises ConfigError for --mig-parted-config beside --dra-dynamic-mig (each would undo
    the other's layouts). Whether its Node can be followed is known where the API client
    is made (wiring.mig)."""
    if opts.device_plugin.mig_parted_config and opts.dra.enabled and opts.dra.dynamic_mig:
        raise ConfigError(BOTH_CHANGE_LAYOUTS)


def _kubelet(kubelet: KubeletOptions, command: str | None) -> KubeletOptions:
    """The plugin directory: the registration socket's, or for `run` not registering, a
    private one named here (`run` creates it, mode 0700, and removes it)."""
    if not kubelet.socket and command == "run":
        import secrets
        import tempfile

        name = f"gpuslice-plugins-{os.getpid()}-{secrets.token_hex(4)}"
        path = os.path.join(tempfile.gettempdir(), name)
        return replace(kubelet, plugin_dir=path, own_plugin_dir=True)
    return replace(kubelet, plugin_dir=os.path.dirname(kubelet.socket) or DEFAULT_PLUGIN_DIR)


def _per_node(source: ConfigSourceOptions, api: ApiOptions) -> ConfigSourceOptions:
    """`source` with its per-node configs found. Raises ConfigError for a directory and a
    ConfigMap at once, either with a config name, or either without a node name."""
    path, config_map = source.file, source.config_map
    found = source.srcdir or (path if path and os.path.isdir(path) else "")
    if found and config_map:
        raise ConfigError(
            f"--config-map (CONFIG_MAP) {show(config_map)} and the config directory "
            f"{found}: give one source of per-node configs, not both"
        )
    _check_no_config_name(source, found)
    if config_map:
        _check_no_config_name(source, f"ConfigMap {config_map}")
    if (found or config_map) and not api.node_name:
        if config_map:
            given, where = "--config-map (CONFIG_MAP)", config_map
        elif source.srcdir:
            given, where = "--config-file-srcdir (CONFIG_FILE_SRCDIR)", found
        else:
            given, where = "--config-file (CONFIG_FILE), a directory,", found
        raise ConfigError(_NO_NODE_NAME.format(given=given, path=where))
    return replace(source, dir=found, per_node=bool(found or config_map))


def _check_no_config_name(source: ConfigSourceOptions, where: str) -> None:
    if where and source.name is not None:
        raise ConfigError(
            f"--config-name {show(source.name)}: not used with the per-node configs of "
            f"{where}; name the config with --default-config (DEFAULT_CONFIG) or the node "
            f"label {source.node_label}"
        )


def _check_dra(opts: RunOptions) -> None:
    """Raises ConfigError when DRA is asked for and cannot be served."""
    if not opts.dra.enabled:
        return
    if not opts.api.node_name or not (opts.api.kubeconfig or opts.api.in_cluster):
        raise ConfigError(NO_API_FOR_DRA)
    if not opts.device_plugin.cdi_spec_dir:
        raise ConfigError(
            "--dra (GPUSLICE_DRA): a DRA claim's devices reach its containers only through "
            "CDI; set --cdi-spec-dir (CDI_SPEC_DIR) to the runtime's CDI directory"
        )


__all__ = ["SECTIONS", "GfdEnv", "RunOptions", "resolve_options"]
