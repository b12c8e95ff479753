"""What one command's line and environment say, resolved once into typed values.

`resolve_options` makes the one pass over the flag table for a command (flags over env
vars over defaults), parses every value, and returns `RunOptions`: the settings that
live outside the config file, typed, plus the flags that land in it (`flags`, applied
to each config loaded, once per load: config.settings). Nothing below the command line
reads a flag's name or parses its text; errors here name the flag and its env var.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from gpuslice.config.checks import duration_seconds, show
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


@dataclass(frozen=True)
class RunOptions:
    """One command's settings outside the config file, typed, and the flags for it.
    Build it with resolve_options; the defaults here are the flag table's."""

    flags: FlagValues  # every flag given, parsed (config.flags.apply_flags per load)
    config_name: str | None = None  # --config-name: one entry of a ConfigMap manifest
    fake_hardware: str | None = None  # a simulated node instead of NVML
    fake_events: str | None = None  # its JSON-lines file of injected health events
    in_cluster: bool = False  # KUBERNETES_SERVICE_HOST is set
    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    config_file: str = ""
    kubelet_socket: str = ""  # empty: do not register
    driver_root_ctr_path: str = ""  # as given (flag, env var or default), not the file's
    cdi_spec_dir: str = ""
    node_name: str = ""
    node_label: str = ""
    config_file_srcdir: str = ""
    config_map: str = ""
    default_config: str = ""
    fallback_strategies: tuple[str, ...] = ()
    namespace: str = ""
    kubeconfig: str = ""
    pod_name: str = ""
    labels: str = "auto"  # auto (when in a cluster), true or false
    status_address: str = ""  # host:port of /healthz, /readyz (and /metrics); empty: off
    metrics_address: str = ""  # host:port of /metrics alone; empty: on status_address
    metrics_auth: str = "none"  # none | kubernetes (TokenReview and SubjectAccessReview)
    status_socket: str = ""  # a unix socket serving the status endpoints too
    pod_resources_socket: str = ""
    accounting: bool = True
    proc_root: str = ""
    sample_interval_s: float = 10.0
    memory_budgets: Mapping[str, int] = field(default_factory=dict)
    memory_budget_policy: Policy = Policy.REPORT
    memory_isolation: bool = False
    cgroup_root: str = DEFAULT_CGROUP_ROOT
    mps_control_binary: str = ""
    mps_control_socket: str = ""  # gpuslice mps-control's; empty: daemons started here
    mps_root: str = ""  # as given (flag, env var), not the file's: where past daemons may run
    mps_pinned_memory_limit_mib: int = 0
    # With --kubelet-socket "" (do not register): a private directory of this process
    # for the plugin sockets, so the node's device-plugin directory is never touched.
    own_plugin_dir: str | None = None
    # The static CDI directory, read beside --cdi-spec-dir for the toolkit's spec.
    cdi_static_dir: str = "/etc/cdi"
    dra: DraOptions | None = None  # None: DRA is not served (--dra)
    mig_parted_config: str = ""  # the mig-parted file the mig.config label names into
    dra_device_plugin_resources: frozenset[str] = frozenset()  # kept on the device-plugin API
    dra_plugins_dir: str = ""  # the DRA socket and checkpoint go in <this>/<driver>
    dra_registry_dir: str = ""

    @property
    def plugin_dir(self) -> str:
        if not self.kubelet_socket and self.own_plugin_dir:
            return self.own_plugin_dir
        return os.path.dirname(self.kubelet_socket) or DEFAULT_PLUGIN_DIR

    @cached_property
    def config_dir(self) -> str:
        """The mounted ConfigMap directory of per-node configs, if any. Raises ConfigError
        when a config name is given too: there the node label or default picks it."""
        path = self.config_file
        found = self.config_file_srcdir or (path if path and os.path.isdir(path) else "")
        if found and self.config_map:
            raise ConfigError(
                f"--config-map (CONFIG_MAP) {show(self.config_map)} and the config directory "
                f"{found}: give one source of per-node configs, not both"
            )
        self._check_no_config_name(found)
        return found

    @cached_property
    def per_node(self) -> bool:
        """Whether the config is chosen per node (a directory or a ConfigMap of configs).
        Raises ConfigError for both at once, with a config name, or without a node name."""
        found = self.config_dir
        if self.config_map:
            self._check_no_config_name(f"ConfigMap {self.config_map}")
        if (found or self.config_map) and not self.node_name:
            given, path = (
                ("--config-map (CONFIG_MAP)", self.config_map)
                if self.config_map
                else (self._dir_flag(), found)
            )
            raise ConfigError(_NO_NODE_NAME.format(given=given, path=path))
        return bool(found or self.config_map)

    def _dir_flag(self) -> str:
        if self.config_file_srcdir:
            return "--config-file-srcdir (CONFIG_FILE_SRCDIR)"
        return "--config-file (CONFIG_FILE), a directory,"

    def _check_no_config_name(self, source: str) -> None:
        if source and self.config_name is not None:
            raise ConfigError(
                f"--config-name {show(self.config_name)}: not used with the per-node configs of "
                f"{source}; name the config with --default-config (DEFAULT_CONFIG) or the node "
                f"label {self.node_label}"
            )


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
    only the env vars of the flags it takes count). Raises ConfigError naming the flag
    or env var."""
    env = {} if env is None else env
    flags = read_flags(cli_values or {}, env, command)
    text, value = flags.text, flags.value
    opts = RunOptions(
        flags,
        config_name=config_name,
        fake_hardware=fake_hardware,
        fake_events=fake_events,
        in_cluster=bool(env.get("KUBERNETES_SERVICE_HOST")),
        xid_policy=xid_policy_from_env(env),
        recovery=recovery_from_env(env),
        config_file=text("config-file"),
        kubelet_socket=text("kubelet-socket"),
        driver_root_ctr_path=text("driver-root-ctr-path"),
        cdi_spec_dir=text("cdi-spec-dir"),
        node_name=text("node-name"),
        node_label=text("node-label"),
        config_file_srcdir=text("config-file-srcdir"),
        config_map=text("config-map"),
        default_config=text("default-config"),
        fallback_strategies=tuple(str(v) for v in _tuple(value("fallback-strategies"))),
        namespace=text("namespace"),
        kubeconfig=text("kubeconfig"),
        pod_name=text("pod-name"),
        labels=text("labels"),
        status_address=text("status-address"),
        metrics_address=text("metrics-address"),
        metrics_auth=text("metrics-auth"),
        status_socket=text("status-socket"),
        pod_resources_socket=text("pod-resources-socket"),
        accounting=bool(value("accounting")),
        proc_root=text("proc-root"),
        sample_interval_s=interval_seconds(text("sample-interval")),
        memory_budgets=parse_budgets(text("memory-budget")),
        memory_budget_policy=Policy(text("memory-budget-policy")),
        memory_isolation=bool(value("memory-isolation")),
        cgroup_root=text("cgroup-root"),
        mps_control_binary=text("mps-control-binary"),
        mps_control_socket=text("mps-control-socket"),
        mps_root=text("mps-root"),
        mps_pinned_memory_limit_mib=_count(value("mps-pinned-memory-limit")),
        dra=DraOptions(
            driver=text("dra-driver-name"),
            consumable_shares=bool(value("dra-consumable-shares")),
            taint_unhealthy=bool(value("dra-taint-unhealthy")),
            mig_devices=bool(value("dra-mig-devices")),
            dynamic_mig=bool(value("dra-dynamic-mig")),
        )
        if value("dra")
        else None,
        dra_device_plugin_resources=frozenset(
            str(v) for v in _tuple(value("dra-device-plugin-resources"))
        ),
        dra_plugins_dir=text("dra-plugins-dir"),
        dra_registry_dir=text("dra-registry-dir"),
        mig_parted_config=text("mig-parted-config"),
    )
    if command != "inspect":  # inspect shows what DRA would publish, with no cluster
        _check_dra(opts)
    return opts


def _check_dra(opts: RunOptions) -> None:
    """Raises ConfigError when DRA is asked for and cannot be served."""
    if opts.dra is None:
        return
    if not opts.node_name or not (opts.kubeconfig or opts.in_cluster):
        raise ConfigError(NO_API_FOR_DRA)
    if not opts.cdi_spec_dir:
        raise ConfigError(
            "--dra (GPUSLICE_DRA): a DRA claim's devices reach its containers only through "
            "CDI; set --cdi-spec-dir (CDI_SPEC_DIR) to the runtime's CDI directory"
        )


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


def _tuple(value: object) -> tuple[object, ...]:
    return value if isinstance(value, tuple) else ()


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


__all__ = ["GfdEnv", "RunOptions", "resolve_options"]
