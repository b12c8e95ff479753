"""Every command-line flag and env var of the agent, and the precedence that combines them
with the config file: explicit CLI flag > env var > config file > built-in default.

Names and env vars are upstream's (nvidia-device-plugin and gpu-feature-discovery), so an
existing DaemonSet's environment keeps its meaning. The CLI builds its options from FLAGS
and hands the explicitly given ones to resolve() as strings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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
    show,
    suggest,
)
from gpuslice.config.decode import config_error
from gpuslice.config.v1 import Config
from gpuslice.core.response import LIST_STRATEGIES
from gpuslice.core.selection import DEFAULT_FALLBACKS, DEFAULT_LABEL
from gpuslice.core.selection import FALLBACKS as SELECTION_FALLBACKS

BOOL = "bool"
STRING = "string"
LIST = "list"  # comma-separated strings
INT_LIST = "int-list"  # comma-separated integers
NUMBER = "number"  # a decimal number >= 0
COUNT = "count"  # an integer >= 0

TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")
KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"

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

    @property
    def options(self) -> tuple[str, ...]:
        return (f"--{self.name}", *self.aliases)

    @property
    def param(self) -> str:
        """The Python identifier click derives from the first option name."""
        return self.name.replace("-", "_")

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


def _flag(name: str, env: str, key: str | None, default: FlagValue, help: str, **kw: Any) -> Flag:
    return Flag(name, tuple(env.split()), key, default, help, **kw)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    _flag("mig-strategy", "MIG_STRATEGY GFD_MIG_STRATEGY", "flags.migStrategy", "none",
          "how MIG devices are advertised", choices=MIG_STRATEGIES),
    _flag("fail-on-init-error", "FAIL_ON_INIT_ERROR GFD_FAIL_ON_INIT_ERROR",
          "flags.failOnInitError", True,
          "exit when NVML cannot start (false: advertise nothing and wait)", kind=BOOL),
    _flag("mps-root", "MPS_ROOT", "flags.mpsRoot", "",
          "host directory of the MPS control daemons' pipes and logs"),
    _flag("driver-root", "NVIDIA_DRIVER_ROOT", "flags.nvidiaDriverRoot", "/",
          "root of the NVIDIA driver installation on the host", aliases=("--nvidia-driver-root",)),
    _flag("dev-root", "NVIDIA_DEV_ROOT", "flags.nvidiaDevRoot", None,
          "host root of the /dev nodes (default: the driver root)", aliases=("--nvidia-dev-root",)),
    _flag("gdrcopy-enabled", "GDRCOPY_ENABLED", "flags.gdrcopyEnabled", False,
          "give containers GDRCopy", kind=BOOL),
    _flag("gds-enabled", "GDS_ENABLED", "flags.gdsEnabled", False,
          "give containers GPUDirect Storage", kind=BOOL),
    _flag("mofed-enabled", "MOFED_ENABLED", "flags.mofedEnabled", False,
          "give containers MOFED (RDMA) devices", kind=BOOL),
    _flag("use-node-feature-api", "GFD_USE_NODE_FEATURE_API USE_NODE_FEATURE_API",
          "flags.useNodeFeatureAPI", True,
          "publish labels as a NodeFeature object (false: a features.d file)", kind=BOOL),
    _flag("device-discovery-strategy", "DEVICE_DISCOVERY_STRATEGY",
          "flags.deviceDiscoveryStrategy", "auto", "how GPUs are found",
          choices=DISCOVERY_STRATEGIES),
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
          "path of the CDI hook written into CDI specs", aliases=("--nvidia-ctk-path",)),
    _flag("driver-root-ctr-path", "DRIVER_ROOT_CTR_PATH CONTAINER_DRIVER_ROOT",
          "flags.plugin.containerDriverRoot", "/driver-root",
          "where the driver root is mounted in this container",
          aliases=("--container-driver-root",)),
    _flag("shared-devices-allocation-policy", "SHARED_DEVICES_ALLOCATION_POLICY",
          "flags.plugin.sharedDevicesAllocationPolicy", "distributed",
          "how shared and MIG devices are picked", choices=ALLOCATION_POLICIES),
    _flag("oneshot", "GFD_ONESHOT", "flags.gfd.oneshot", False,
          "label once and exit", kind=BOOL),
    _flag("no-timestamp", "GFD_NO_TIMESTAMP", "flags.gfd.noTimestamp", False,
          "leave the timestamp label out", kind=BOOL),
    _flag("sleep-interval", "GFD_SLEEP_INTERVAL", "flags.gfd.sleepInterval", "60s",
          'time between label refreshes ("60s", "1m30s" or "infinite")'),
    _flag("output-file", "GFD_OUTPUT_FILE", "flags.gfd.outputFile",
          "/etc/kubernetes/node-feature-discovery/features.d/gfd",
          "features.d file for labels (empty: stdout)", aliases=("--output", "-o")),
    _flag("machine-type-file", "GFD_MACHINE_TYPE_FILE", "flags.gfd.machineTypeFile",
          "/sys/class/dmi/id/product_name", "file that holds the machine type"),
    _flag("imex-channel-ids", "IMEX_CHANNEL_IDS", "imex.channelIDs", (),
          "IMEX channels given to every container (empty or 0)", kind=INT_LIST),
    _flag("imex-required", "IMEX_REQUIRED", "imex.required", False,
          "fail when a requested IMEX channel is missing", kind=BOOL),
    _flag("config-file", "CONFIG_FILE GFD_CONFIG_FILE", None, "",
          "config file, ConfigMap manifest or mounted ConfigMap directory"),
    _flag("kubelet-socket", "KUBELET_SOCKET", None, KUBELET_SOCKET,
          "kubelet registration socket (empty: do not register)"),
    _flag("cdi-feature-flags", "CDI_FEATURE_FLAGS", None, (),
          "feature flags for CDI spec generation (comma-separated; accepted, no effect: "
          "no CDI specs are generated)", kind=LIST),
    _flag("cdi-disable-hooks", "CDI_DISABLE_HOOKS", None, (),
          "hooks left out of generated CDI specs, or all (comma-separated; accepted, no "
          "effect: no CDI specs are generated)", kind=LIST),
    _flag("node-name", "NODE_NAME", None, "",
          "this node's name (labels, per-node config, events)"),
    _flag("node-label", "NODE_LABEL", None, DEFAULT_LABEL,
          "node label that names the config to use"),
    _flag("config-file-srcdir", "CONFIG_FILE_SRCDIR", None, "",
          "mounted ConfigMap directory of named configs (per-node configs)"),
    _flag("default-config", "DEFAULT_CONFIG", None, "",
          "config to use when the node label is unset"),
    _flag("fallback-strategies", "FALLBACK_STRATEGIES", None, DEFAULT_FALLBACKS,
          "what to use when the label and default are unset (comma-separated)",
          kind=LIST, choices=SELECTION_FALLBACKS),
    _flag("namespace", "NAMESPACE", None, "default",
          "namespace of the NodeFeature object and Events"),
    _flag("kubeconfig", "KUBECONFIG", None, "",
          "kubeconfig file (empty: in-cluster config)"),
    _flag("kube-api-qps", "KUBE_API_QPS", None, 5.0,
          "Kubernetes API queries per second (accepted, no effect)", kind=NUMBER),
    _flag("kube-api-burst", "KUBE_API_BURST", None, 10,
          "Kubernetes API request burst (accepted, no effect)", kind=COUNT),
    _flag("pod-name", "POD_NAME", None, "",
          "this pod's name: owner of the NodeFeature object (set from the downward API)"),
    _flag("labels", "GPUSLICE_LABELS", None, "auto",
          "publish node labels beside the plugin: auto (when in a cluster), true or false",
          choices=("auto", "true", "false")),
    _flag("status-address", "GPUSLICE_STATUS_ADDRESS", None, "",
          "host:port for /healthz and /readyz (empty: off)"),
)
# fmt: on

FLAGS_BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
_EXPECTED_KIND = {
    BOOL: "true or false (1/0, yes/no)",
    INT_LIST: "comma-separated integers",
    NUMBER: "a number of 0 or more, such as 5 or 2.5",
    COUNT: "an integer of 0 or more",
}


class GfdEnv(dict[str, str]):
    """The environment as GPU Feature Discovery reads it: a flag's GFD_-prefixed variable
    before its other names (GFD_MIG_STRATEGY before MIG_STRATEGY). The plugin reads the
    unprefixed names first; upstream's plugin has no GFD_ names at all."""


def resolve(config: Config, cli_values: Mapping[str, str], env: Mapping[str, str]) -> Config:
    """The effective config. `cli_values` holds only the flags given on the command line
    (keys: Flag.name), as strings. Raises ConfigError naming the flag or env var."""
    unknown = sorted(set(cli_values) - FLAGS_BY_NAME.keys())
    if unknown:
        raise ValueError(f"not flags of the table: {', '.join(unknown)}")
    for flag in FLAGS:
        if flag.key is None:
            continue
        attrs = _ATTRS[flag.name]
        given = _given(flag, cli_values, env)
        if given is not None:
            origin, text = given
            config = _put(config, attrs, _parse(flag, origin, text), origin)
        elif _get(config, attrs) is None and flag.default is not None:
            config = _put(config, attrs, flag.default, "default")
    return config


def with_defaults(config: Config) -> Config:
    """`config` with every unset flag at its built-in default (no CLI, no env)."""
    return resolve(config, {}, {})


def setting(name: str, cli_values: Mapping[str, str], env: Mapping[str, str]) -> str:
    """A setting that is not stored in the config (config-file, kubelet-socket)."""
    flag = FLAGS_BY_NAME[name]
    given = _given(flag, cli_values, env)
    return given[1] if given is not None else flag.default_text


def check_settings(cli_values: Mapping[str, str], env: Mapping[str, str]) -> dict[str, FlagValue]:
    """Every setting that is not stored in the config, parsed and checked: the value given,
    else the default. Raises ConfigError naming the flag or env var."""
    values: dict[str, FlagValue] = {}
    for flag in FLAGS:
        if flag.key is not None:
            continue
        given = _given(flag, cli_values, env)
        if given is None:
            values[flag.name] = flag.default
            continue
        origin, text = given
        value = _parse(flag, origin, text)
        for item in value if isinstance(value, tuple) else (value,):
            if flag.choices and item not in flag.choices:
                hint = suggest(str(item), flag.choices)
                allowed = "one of " + ", ".join(flag.choices)
                allowed += f" (did you mean {hint}?)" if hint else ""
                raise config_error(origin, "", f"got {show(item)}; expected {allowed}")
        values[flag.name] = value
    return values


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
    if flag.kind == COUNT and word.isascii() and word.isdigit():
        return int(word)
    items = tuple(part.strip() for part in text.split(",") if part.strip())
    if flag.kind == LIST:
        return items
    if flag.kind == INT_LIST and all(item.isascii() and item.isdigit() for item in items):
        return tuple(int(item) for item in items)
    if flag.kind in _EXPECTED_KIND:
        raise config_error(origin, "", f"got {show(text)}; expected {_EXPECTED_KIND[flag.kind]}")
    return text


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
