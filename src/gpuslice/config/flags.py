"""Every command-line flag and env var of the agent, and the precedence that combines them
with the config file: explicit CLI flag > env var > config file > built-in default.

Names and env vars are upstream's (nvidia-device-plugin and gpu-feature-discovery), so an
existing DaemonSet's environment keeps its meaning. The CLI builds its options from FLAGS
and hands the explicitly given ones to resolve() as strings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, reduce
from typing import Any

import msgspec
from msgspec.structs import replace

from gpuslice.config.checks import (
    ALLOCATION_POLICIES,
    DISCOVERY_STRATEGIES,
    ID_STRATEGIES,
    MIG_STRATEGIES,
    FieldError,
    duration_seconds,
    show,
    suggest,
)
from gpuslice.config.decode import config_error
from gpuslice.config.v1 import Config
from gpuslice.core.dra.devices import driver_name_problem
from gpuslice.core.errors import SettingError
from gpuslice.core.response import LIST_STRATEGIES
from gpuslice.core.selection import DEFAULT_FALLBACKS, DEFAULT_LABEL
from gpuslice.core.selection import FALLBACKS as SELECTION_FALLBACKS

BOOL = "bool"
STRING = "string"
LIST = "list"  # comma-separated strings
INT_LIST = "int-list"  # comma-separated integers
NUMBER = "number"  # a decimal number >= 0
COUNT = "count"  # an integer from 0 to MAX_COUNT
MAX_COUNT = (1 << 31) - 1  # far above any count or MiB a flag takes
ADDRESS = "address"  # host:port, [ipv6]:port or :port (every IPv4 address); empty: off
DURATION = "duration"  # a positive Go duration ("10s", "500ms"), kept as text

TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")
KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

FlagValue = str | bool | int | float | tuple[str, ...] | tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class Flag:
    name: str  # the long option without dashes; also the key of resolve()'s cli_values
    env: tuple[str, ...]  # env vars read when the flag is not given; the first set wins
    # (the plugin's order; GfdEnv reads GFD_ names first, as GPU Feature Discovery does)
    key: str | None  # where the value lands in the config file; None: not a config setting
    default: FlagValue  # None: unset (nvidiaDevRoot then falls back to nvidiaDriverRoot)
    help: str
    kind: str = STRING
    choices: tuple[str, ...] = ()  # allowed values (of each item, for a list)
    aliases: tuple[str, ...] = ()  # further spellings, with their dashes
    uses: frozenset[str] = frozenset({"run"})  # the commands it has an effect in
    # further commands that take it without effect, as upstream's binary for that job
    # does (a DaemonSet's arguments keep working); left out of their --help
    accepts: frozenset[str] = frozenset()
    check: Callable[[str], str] | None = None  # why a value (each item) is refused, or ""
    metavar: str = ""  # what --help calls its value (empty: click's word for the type)

    @property
    def options(self) -> tuple[str, ...]:
        return (f"--{self.name}", *self.aliases)

    @property
    def param(self) -> str:
        """The Python identifier click derives from the first option name."""
        return self.name.replace("-", "_")

    def taken_by(self, command: str) -> bool:
        return command in self.uses or command in self.accepts

    @property
    def is_bool(self) -> bool:
        return self.kind == BOOL

    @property
    def default_text(self) -> str:
        value = self.default
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value) if isinstance(value, int) else value or ""


def _flag(
    name: str,
    env: str,
    key: str | None,
    default: FlagValue,
    help: str,
    uses: str = "run",
    accepts: str = "",
    **kw: Any,
) -> Flag:
    """`uses` and `accepts` name commands, space-separated."""
    using, accepting = frozenset(uses.split()), frozenset(accepts.split())
    return Flag(name, tuple(env.split()), key, default, help, **kw, uses=using, accepts=accepting)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    _flag("mig-strategy", "MIG_STRATEGY GFD_MIG_STRATEGY", "flags.migStrategy", "none",
          "how MIG devices are advertised", choices=MIG_STRATEGIES,
          uses="run labels inspect"),
    _flag("fail-on-init-error", "FAIL_ON_INIT_ERROR GFD_FAIL_ON_INIT_ERROR",
          "flags.failOnInitError", True,
          "exit when NVML cannot start (false: advertise nothing and wait)", kind=BOOL,
          uses="run labels"),
    _flag("mps-root", "MPS_ROOT", "flags.mpsRoot", "",
          "host directory of the MPS control daemons' pipes and logs",
          uses="run inspect mps-control", accepts="labels"),
    _flag("mps-control-binary", "GPUSLICE_MPS_CONTROL_BINARY", None, "nvidia-cuda-mps-control",
          "the MPS control binary a daemon per MPS resource is started and driven with "
          "(default with --fake-hardware: the simulated one)", uses="run mps-control"),
    _flag("mps-control-socket", "GPUSLICE_MPS_CONTROL_SOCKET", None, "",
          "socket of `gpuslice mps-control`, which MPS daemons are started from (unset: "
          "the agent starts them itself, and they live as long as its container)",
          uses="run mps-control"),
    _flag("mps-pinned-memory-limit", "GPUSLICE_MPS_PINNED_MEMORY_LIMIT", None, 0,
          "pinned device memory limit of each MPS client in MiB (0: the GPU's memory "
          "divided by its replicas, as upstream)", kind=COUNT, uses="run inspect"),
    _flag("driver-root", "NVIDIA_DRIVER_ROOT", "flags.nvidiaDriverRoot", "/",
          "root of the NVIDIA driver installation on the host", aliases=("--nvidia-driver-root",),
          uses="run", accepts="labels"),
    _flag("dev-root", "NVIDIA_DEV_ROOT", "flags.nvidiaDevRoot", None,
          "host root of the /dev nodes (default: the driver root)", aliases=("--nvidia-dev-root",),
          uses="run", accepts="labels"),
    _flag("gdrcopy-enabled", "GDRCOPY_ENABLED", "flags.gdrcopyEnabled", False,
          "give containers GDRCopy", kind=BOOL,
          uses="run", accepts="labels"),
    _flag("gds-enabled", "GDS_ENABLED", "flags.gdsEnabled", False,
          "give containers GPUDirect Storage", kind=BOOL,
          uses="run", accepts="labels"),
    _flag("mofed-enabled", "MOFED_ENABLED", "flags.mofedEnabled", False,
          "give containers MOFED (RDMA) devices", kind=BOOL,
          uses="run", accepts="labels"),
    _flag("use-node-feature-api", "GFD_USE_NODE_FEATURE_API USE_NODE_FEATURE_API",
          "flags.useNodeFeatureAPI", True,
          "publish labels as a NodeFeature object (false: a features.d file)", kind=BOOL,
          uses="run labels"),
    _flag("device-discovery-strategy", "DEVICE_DISCOVERY_STRATEGY",
          "flags.deviceDiscoveryStrategy", "auto", "how GPUs are found",
          choices=DISCOVERY_STRATEGIES,
          uses="", accepts="run labels"),
    _flag("pass-device-specs", "PASS_DEVICE_SPECS", "flags.plugin.passDeviceSpecs", False,
          "return device nodes in Allocate (for the static CPU manager)", kind=BOOL),
    _flag("device-list-strategy", "DEVICE_LIST_STRATEGY", "flags.plugin.deviceListStrategy",
          ("envvar",), "how containers are told their devices (comma-separated)",
          kind=LIST, choices=LIST_STRATEGIES),
    _flag("device-id-strategy", "DEVICE_ID_STRATEGY", "flags.plugin.deviceIDStrategy", "uuid",
          "how devices are named to containers", choices=ID_STRATEGIES),
    _flag("cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX", "flags.plugin.cdiAnnotationPrefix",
          "cdi.k8s.io/", "prefix of the CDI annotations"),
    _flag("nvidia-cdi-hook-path", "NVIDIA_CDI_HOOK_PATH NVIDIA_CTK_PATH",
          "flags.plugin.nvidiaCTKPath", "/usr/bin/nvidia-ctk",
          "path of NVIDIA's CDI hook (accepted, no effect: the generated specs have no "
          "hooks)", aliases=("--nvidia-ctk-path",),
          uses="", accepts="run"),
    _flag("driver-root-ctr-path", "DRIVER_ROOT_CTR_PATH CONTAINER_DRIVER_ROOT",
          "flags.plugin.containerDriverRoot", "/driver-root",
          "where the driver root is mounted in this container (NVML and the IMEX channel "
          "devices are looked for there)", aliases=("--container-driver-root",),
          uses="run labels inspect"),
    _flag("shared-devices-allocation-policy", "SHARED_DEVICES_ALLOCATION_POLICY",
          "flags.plugin.sharedDevicesAllocationPolicy", "distributed",
          "how shared and MIG devices are picked", choices=ALLOCATION_POLICIES),
    _flag("oneshot", "GFD_ONESHOT", "flags.gfd.oneshot", False,
          "label once and exit", kind=BOOL,
          uses="labels"),
    _flag("no-timestamp", "GFD_NO_TIMESTAMP", "flags.gfd.noTimestamp", False,
          "leave the timestamp label out", kind=BOOL,
          uses="run labels"),
    _flag("sleep-interval", "GFD_SLEEP_INTERVAL", "flags.gfd.sleepInterval", "60s",
          'time between label refreshes ("60s", "1m30s" or "infinite")',
          uses="run labels"),
    _flag("output-file", "GFD_OUTPUT_FILE", "flags.gfd.outputFile",
          "/etc/kubernetes/node-feature-discovery/features.d/gfd",
          "features.d file for labels (empty: stdout)", aliases=("--output", "-o"),
          uses="run labels"),
    _flag("machine-type-file", "GFD_MACHINE_TYPE_FILE", "flags.gfd.machineTypeFile",
          "/sys/class/dmi/id/product_name", "file that holds the machine type",
          uses="run labels inspect"),
    _flag("imex-channel-ids", "IMEX_CHANNEL_IDS", "imex.channelIDs", (),
          "IMEX channels given to every container (empty or 0)", kind=INT_LIST),
    _flag("imex-required", "IMEX_REQUIRED", "imex.required", False,
          "fail when a requested IMEX channel is missing", kind=BOOL),
    _flag("config-file", "CONFIG_FILE GFD_CONFIG_FILE", None, "",
          "config file, ConfigMap manifest or mounted ConfigMap directory",
          uses="run labels inspect"),
    _flag("kubelet-socket", "KUBELET_SOCKET", None, KUBELET_SOCKET,
          "kubelet registration socket (empty: do not register)"),
    _flag("cdi-feature-flags", "CDI_FEATURE_FLAGS", None, (),
          "feature flags for CDI spec generation (comma-separated; accepted, no effect: "
          "the generated specs have no optional features)", kind=LIST,
          uses="", accepts="run"),
    _flag("cdi-disable-hooks", "CDI_DISABLE_HOOKS", None, (),
          "hooks left out of generated CDI specs, or all (comma-separated; accepted, no "
          "effect: the generated specs have no hooks)", kind=LIST,
          uses="", accepts="run"),
    _flag("cdi-spec-dir", "CDI_SPEC_DIR", None, "/var/run/cdi",
          "directory of the CDI specs written under a cdi-* device-list strategy (and "
          "of the NVIDIA Container Toolkit's, whose devices are named beside them)",
          uses="run inspect"),
    _flag("node-name", "NODE_NAME", None, "",
          "this node's name (labels, per-node config, events, the DRA pool)",
          uses="run labels inspect"),
    _flag("node-label", "NODE_LABEL", None, DEFAULT_LABEL,
          "node label that names the config to use"),
    _flag("config-file-srcdir", "CONFIG_FILE_SRCDIR", None, "",
          "mounted ConfigMap directory of named configs (per-node configs)"),
    _flag("config-map", "CONFIG_MAP", None, "",
          "ConfigMap of named configs in --namespace, watched through the API (per-node "
          "configs, applied within a second of an edit)"),
    _flag("default-config", "DEFAULT_CONFIG", None, "",
          "config to use when the node label is unset"),
    _flag("fallback-strategies", "FALLBACK_STRATEGIES", None, DEFAULT_FALLBACKS,
          "what to use when the label and default are unset (comma-separated)",
          kind=LIST, choices=SELECTION_FALLBACKS),
    _flag("namespace", "NAMESPACE", None, "default",
          "namespace of the NodeFeature object and Events",
          uses="run labels"),
    _flag("kubeconfig", "KUBECONFIG", None, "",
          "kubeconfig file (empty: in-cluster config)",
          uses="run labels"),
    _flag("kube-api-qps", "KUBE_API_QPS", None, 5.0,
          "Kubernetes API queries per second (accepted, no effect)", kind=NUMBER,
          uses="", accepts="run labels"),
    _flag("kube-api-burst", "KUBE_API_BURST", None, 10,
          "Kubernetes API request burst (accepted, no effect)", kind=COUNT,
          uses="", accepts="run labels"),
    _flag("pod-name", "POD_NAME", None, "",
          "this pod's name: owner of the NodeFeature object (set from the downward API)",
          uses="run labels"),
    _flag("labels", "GPUSLICE_LABELS", None, "auto",
          "publish node labels beside the plugin: auto (when in a cluster), true or false",
          choices=("auto", "true", "false")),
    _flag("status-address", "GPUSLICE_STATUS_ADDRESS", None, "",
          "host:port for /healthz and /readyz, and /metrics unless --metrics-address is set "
          "(empty: off)", kind=ADDRESS),
    _flag("metrics-address", "GPUSLICE_METRICS_ADDRESS", None, "",
          "host:port serving /metrics alone, e.g. 127.0.0.1:9400 (empty: /metrics is on "
          "--status-address)", kind=ADDRESS),
    _flag("metrics-auth", "GPUSLICE_METRICS_AUTH", None, "none",
          "who may read /metrics: none (anyone who reaches it) or kubernetes (a bearer "
          "token that a TokenReview authenticates and a SubjectAccessReview allows to get "
          "/metrics)", choices=("none", "kubernetes")),
    _flag("status-socket", "GPUSLICE_STATUS_SOCKET", None, "",
          "a unix socket path serving what --status-address serves, beside it, for exec "
          "probes that must reach this pod's own agent (empty: off)"),
    _flag("sample-interval", "GPUSLICE_SAMPLE_INTERVAL", None, "10s",
          'time between per-process GPU samples for accounting ("10s", "500ms")',
          kind=DURATION),
    _flag("pod-resources-socket", "GPUSLICE_POD_RESOURCES_SOCKET", None, POD_RESOURCES_SOCKET,
          "the kubelet's PodResources API socket, read for accounting and to hold back "
          "devices moved while in use"),
    _flag("accounting", "GPUSLICE_ACCOUNTING", None, True,
          "sample per-process GPU use, join it with the kubelet's allocations, and watch "
          "memory budgets", kind=BOOL),
    _flag("proc-root", "GPUSLICE_PROC_ROOT", None, "/proc",
          "where the host's /proc is mounted, read for each GPU process's pod (accounting)"),
    _flag("memory-isolation", "GPUSLICE_MEMORY_ISOLATION", None, False,
          "limit each pod's GPU memory through the driver's per-cgroup limits (driver r615, "
          "cgroup v2) where the node can; the config's memoryIsolation block tunes it",
          kind=BOOL, uses="run inspect"),
    _flag("cgroup-root", "GPUSLICE_CGROUP_ROOT", None, "/sys/fs/cgroup",
          "where the host's cgroup v2 tree is mounted, searched for the kubelet's kubepods "
          "cgroup and watched for pods' cgroups (--memory-isolation)", uses="run inspect"),
    _flag("memory-budget-policy", "GPUSLICE_MEMORY_BUDGET_POLICY", None, "report",
          "what to do with a container over its GPU memory budget on a time-sliced replica: "
          "report, unhealthy (hold its GPU's replicas Unhealthy) or terminate (SIGKILL its "
          "largest process)", choices=("report", "unhealthy", "terminate")),
    _flag("mig-parted-config", "MIG_PARTED_CONFIG_FILE", None, "",
          "NVIDIA mig-parted config file (version v1): the node label nvidia.com/mig.config "
          "names one of its configs, and each GPU's MIG layout is made the one it names "
          "(empty: MIG layouts are left as they are)"),
    _flag("dra", "GPUSLICE_DRA", None, False,
          "also serve Dynamic Resource Allocation: a DRA kubelet plugin publishing this "
          "node's ResourceSlices", kind=BOOL, uses="run inspect"),
    _flag("dra-driver-name", "GPUSLICE_DRA_DRIVER_NAME", None, "gpu.nvidia.com",
          "the DRA driver name (NVIDIA's by default, so its claims and classes work)",
          uses="run inspect", check=driver_name_problem),
    _flag("dra-device-plugin-resources", "GPUSLICE_DRA_DEVICE_PLUGIN_RESOURCES", None, (),
          "resources that stay on the device-plugin API when DRA is on (comma-separated); "
          "DRA serves the others, and each name has one front-end", kind=LIST,
          uses="run inspect", check=lambda name: _resource_problem(name)),
    _flag("dra-consumable-shares", "GPUSLICE_DRA_CONSUMABLE_SHARES", None, False,
          "publish a replicated GPU once with consumable capacity `shares` (Kubernetes "
          "1.36 DRAConsumableCapacity)", kind=BOOL, uses="run inspect"),
    _flag("dra-mig-devices", "GPUSLICE_DRA_MIG_DEVICES", None, True,
          "publish the MIG devices of MIG-enabled GPUs under DRA, as NVIDIA's DRA driver "
          "does, whatever --mig-strategy says; false: follow --mig-strategy", kind=BOOL,
          uses="run inspect"),
    _flag("dra-dynamic-mig", "GPUSLICE_DRA_DYNAMIC_MIG", None, False,
          "publish every MIG placement of MIG-enabled GPUs as a partitionable DRA device "
          "(shared counters) and create the MIG instance when a claim is prepared",
          kind=BOOL, uses="run inspect"),
    _flag("dra-taint-unhealthy", "GPUSLICE_DRA_TAINT_UNHEALTHY", None, False,
          "taint unhealthy DRA devices NoSchedule (1.36 DRADeviceTaints) instead of "
          "withdrawing them", kind=BOOL, uses="run inspect"),
    _flag("dra-plugins-dir", "GPUSLICE_DRA_PLUGINS_DIR", None, "/var/lib/kubelet/plugins",
          "the kubelet's plugins directory; the DRA socket and checkpoint go in "
          "<this>/<driver name>"),
    _flag("dra-registry-dir", "GPUSLICE_DRA_REGISTRY_DIR", None,
          "/var/lib/kubelet/plugins_registry",
          "the kubelet's plugin registration directory"),
    _flag("prometheus", "GPUSLICE_PROMETHEUS_URL", None, "",
          "Prometheus' base URL, http:// or https:// (required)", uses="advise", metavar="URL"),
    _flag("prometheus-bearer-token-file", "GPUSLICE_PROMETHEUS_BEARER_TOKEN_FILE", None, "",
          "file holding the bearer token sent to Prometheus, read again on each run "
          "(Prometheus' authorization.credentials_file, bearer_token_file)", uses="advise",
          metavar="FILE"),
    _flag("prometheus-ca-file", "GPUSLICE_PROMETHEUS_CA_FILE", None, "",
          "CA bundle (PEM) that Prometheus' certificate must chain to (tls_config.ca_file; "
          "empty: the system's)", uses="advise", metavar="FILE"),
    _flag("prometheus-cert-file", "GPUSLICE_PROMETHEUS_CERT_FILE", None, "",
          "client certificate (PEM) shown to Prometheus, with --prometheus-key-file "
          "(tls_config.cert_file)", uses="advise", metavar="FILE"),
    _flag("prometheus-key-file", "GPUSLICE_PROMETHEUS_KEY_FILE", None, "",
          "the client certificate's private key (PEM, unencrypted; tls_config.key_file)",
          uses="advise", metavar="FILE"),
    _flag("prometheus-insecure-skip-verify", "GPUSLICE_PROMETHEUS_INSECURE_SKIP_VERIFY", None,
          False, "accept any certificate from Prometheus, unverified "
          "(tls_config.insecure_skip_verify; for a trial only)", kind=BOOL, uses="advise"),
    _flag("memory-budget", "GPUSLICE_MEMORY_BUDGET", None, "",
          'per-replica memory budgets by resource, "nvidia.com/gpu.shared=10Gi,..." '
          "(default: the replica's share of its GPU's memory)"),
)
# fmt: on

FLAGS_BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
_EXPECTED_KIND = {
    BOOL: "true or false (1/0, yes/no)",
    INT_LIST: "comma-separated integers",
    NUMBER: "a number of 0 or more, such as 5 or 2.5",
    COUNT: f"an integer from 0 to {MAX_COUNT}",
    ADDRESS: "host:port, [ipv6]:port or :port with a port from 0 to 65535, or empty (off)",
    DURATION: 'a positive duration such as "10s" or "500ms"',
}
_ADDRESS = re.compile(r"(\[[0-9A-Za-z:.%]+\]|[^\s:\[\]]*):([0-9]{1,5})")


_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _resource_problem(name: str) -> str:
    if len(name) > 253 or not _RESOURCE.fullmatch(name):
        return f"got {show(name)}; expected extended resource names such as nvidia.com/gpu"
    return ""


class GfdEnv(dict[str, str]):
    """The environment as GPU Feature Discovery reads it: a flag's GFD_-prefixed variable
    before its other names (GFD_MIG_STRATEGY before MIG_STRATEGY). The plugin reads the
    unprefixed names first; upstream's plugin has no GFD_ names at all."""


@dataclass(frozen=True, slots=True)
class FlagValues:
    """The flags the command line and env vars give, each parsed and checked once:
    name -> (origin, value), origin as errors name it ("--mig-strategy", "env X")."""

    explicit: Mapping[str, tuple[str, FlagValue]]

    def value(self, name: str) -> FlagValue:
        """The flag's value: the one given, else its default."""
        given = self.explicit.get(name)
        return given[1] if given is not None else FLAGS_BY_NAME[name].default

    def text(self, name: str) -> str:
        """A string flag's value ("" when unset)."""
        value = self.value(name)
        return value if isinstance(value, str) else FLAGS_BY_NAME[name].default_text


NO_FLAGS = FlagValues({})


def read_flags(
    cli_values: Mapping[str, str], env: Mapping[str, str], command: str | None = None
) -> FlagValues:
    """One pass over the table: every flag given on the command line (`cli_values`: only
    those given, keys Flag.name, as strings) or by an env var, parsed and checked; with a
    `command`, only the flags it takes (the env vars of others mean nothing to it).
    Raises ConfigError naming the flag or env var."""
    unknown = sorted(set(cli_values) - FLAGS_BY_NAME.keys())
    if unknown:
        raise ValueError(f"not flags of the table: {', '.join(unknown)}")
    explicit: dict[str, tuple[str, FlagValue]] = {}
    for flag in FLAGS:
        if command is not None and not flag.taken_by(command):
            continue
        given = _given(flag, cli_values, env)
        if given is None:
            continue
        origin, text = given
        value = _parse(flag, origin, text)
        if flag.key is None:
            _check_choices(flag, origin, value)
        else:  # checked as the config file's field is
            _put(_EMPTY, _ATTRS[flag.name], value, origin)
        explicit[flag.name] = (origin, value)
    return FlagValues(explicit)


def apply_flags(config: Config, flags: FlagValues) -> Config:
    """`config` with the given flags over its values and every unset flag at its default:
    one pass over the table, once per config loaded. Raises ConfigError."""
    for flag in FLAGS:
        if flag.key is None:
            continue
        attrs = _ATTRS[flag.name]
        given = flags.explicit.get(flag.name)
        if given is not None:
            origin, value = given
            config = _put(config, attrs, value, origin)
        elif _get(config, attrs) is None and flag.default is not None:
            config = _put(config, attrs, flag.default, "default")
    return config


def resolve(config: Config, cli_values: Mapping[str, str], env: Mapping[str, str]) -> Config:
    """The effective config. `cli_values` holds only the flags given on the command line
    (keys: Flag.name), as strings. Raises ConfigError naming the flag or env var."""
    return apply_flags(config, read_flags(cli_values, env))


def with_defaults(config: Config) -> Config:
    """`config` with every unset flag at its built-in default (no CLI, no env)."""
    return apply_flags(config, NO_FLAGS)


def setting(name: str, cli_values: Mapping[str, str], env: Mapping[str, str]) -> str:
    """A setting that is not stored in the config (config-file, kubelet-socket)."""
    flag = FLAGS_BY_NAME[name]
    given = _given(flag, cli_values, env)
    return given[1] if given is not None else flag.default_text


def check_settings(cli_values: Mapping[str, str], env: Mapping[str, str]) -> dict[str, FlagValue]:
    """Every setting that is not stored in the config, parsed and checked: the value given,
    else the default. Raises ConfigError naming the flag or env var."""
    flags = read_flags(cli_values, env)
    return {f.name: flags.value(f.name) for f in FLAGS_BY_NAME.values() if f.key is None}


def _check_choices(flag: Flag, origin: str, value: FlagValue) -> None:
    for item in value if isinstance(value, tuple) else (value,):
        if flag.choices and item not in flag.choices:
            hint = suggest(str(item), flag.choices)
            allowed = "one of " + ", ".join(flag.choices)
            allowed += f" (did you mean {hint}?)" if hint else ""
            raise config_error(origin, "", f"got {show(item)}; expected {allowed}")
        problem = flag.check(str(item)) if flag.check else ""
        if problem:
            raise config_error(origin, "", problem)


def command_env(command: str, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the variables of the flags `command` does not take."""
    foreign = {var for flag in FLAGS if not flag.taken_by(command) for var in flag.env}
    return {var: value for var, value in environ.items() if var not in foreign}


def split_address(text: str) -> tuple[str, int] | None:
    """(host, port) of a listen address ("" for the host of ":8080"); None if malformed."""
    match = _ADDRESS.fullmatch(text.strip())
    if match is None or int(match[2]) > 65535:
        return None
    return match[1].removeprefix("[").removesuffix("]"), int(match[2])


def _given(
    flag: Flag, cli_values: Mapping[str, str], env: Mapping[str, str]
) -> tuple[str, str] | None:
    """(origin, text) of an explicit value: the CLI flag, else the first env var set."""
    if flag.name in cli_values:
        return f"--{flag.name}", cli_values[flag.name]
    names = flag.env
    if isinstance(env, GfdEnv):
        names = tuple(sorted(names, key=lambda var: not var.startswith("GFD_")))
    return next(((f"env {var}", env[var]) for var in names if var in env), None)


def _parse(flag: Flag, origin: str, text: str) -> FlagValue:
    word = text.strip()
    if flag.kind == BOOL and word.lower() in TRUE_WORDS + FALSE_WORDS:
        return word.lower() in TRUE_WORDS
    if flag.kind == NUMBER and _NUMBER.fullmatch(word):
        return float(word)
    if flag.kind == COUNT and word.isascii() and word.isdigit() and int(word) <= MAX_COUNT:
        return int(word)
    items = tuple(part.strip() for part in text.split(",") if part.strip())
    if flag.kind == LIST:
        return items
    if flag.kind == INT_LIST and all(item.isascii() and item.isdigit() for item in items):
        return tuple(int(item) for item in items)
    if flag.kind == ADDRESS and (not word or split_address(word)):
        return word
    if flag.kind == DURATION and _positive_duration(word):
        return word
    if flag.kind in _EXPECTED_KIND:
        raise config_error(origin, "", f"got {show(text)}; expected {_EXPECTED_KIND[flag.kind]}")
    return text


def _positive_duration(text: str) -> bool:
    try:
        return duration_seconds(text) is not None
    except ValueError:
        return False


def _attr_path(key: str) -> tuple[str, ...]:
    """Config attribute names along a dotted path of file names ("flags.migStrategy")."""
    attrs: list[str] = []
    struct: Any = Config
    for part in key.split("."):
        field = _fields_by_file_name(struct)[part]
        attrs.append(field.name)
        struct = field.type
    return tuple(attrs)


@cache
def _fields_by_file_name(struct: Any) -> dict[str, msgspec.structs.FieldInfo]:
    """Once per struct: msgspec evaluates every annotation on each fields() call."""
    return {f.encode_name: f for f in msgspec.structs.fields(struct)}


_ATTRS = {f.name: _attr_path(f.key) for f in FLAGS if f.key is not None}
_EMPTY = Config()


def _get(config: Config, attrs: tuple[str, ...]) -> object:
    return reduce(getattr, attrs, config)


def _put(config: Config, attrs: tuple[str, ...], value: FlagValue, origin: str) -> Config:
    def put(node: Any, path: tuple[str, ...]) -> Any:
        head, *rest = path
        return replace(node, **{head: put(getattr(node, head), tuple(rest)) if rest else value})

    try:
        result: Config = put(config, attrs)
    except FieldError as exc:
        raise config_error(origin, "", f"got {show(exc.value)}; expected {exc.expected}") from None
    return result


# The core's settings that come from a flag: the core's errors name the parameter, and a
# message to the user names the flag.
SETTING_FLAGS = {
    "pinned_limit_mib": "--mps-pinned-memory-limit",
    "namespace": "--namespace",  # `gpuslice admission`
    "name": "--name",  # `gpuslice admission`
}


def explain(error: BaseException) -> str:
    """`error`'s one-line message, naming the flag a refused setting came from."""
    if isinstance(error, SettingError) and error.setting in SETTING_FLAGS:
        return error.named(SETTING_FLAGS[error.setting])
    return str(error)
