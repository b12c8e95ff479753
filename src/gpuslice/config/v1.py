"""The v1 config file schema (NVIDIA's `version: v1`), as frozen msgspec Structs.

Field names are snake_case here and camelCase in the file. Every flag field is nullable:
None means "not set in the file" and is filled by precedence (see flags.py). Values are
checked when a struct is built, so a Config that exists is valid.
"""

from __future__ import annotations

import msgspec

from gpuslice.config.checks import (
    ALLOCATION_POLICIES,
    DISCOVERY_STRATEGIES,
    EXPECTED,
    ID_STRATEGIES,
    MAX_REPLICAS,
    MIG_STRATEGIES,
    FieldError,
    check_choice,
    check_devices,
    check_duration,
    resource_name,
)
from gpuslice.config.resource_names import check_servable
from gpuslice.core import strategies
from gpuslice.core.quantity import parse_bytes
from gpuslice.core.response import LIST_STRATEGIES

VERSION = "v1"

DeviceRef = str | int
Devices = str | int | tuple[DeviceRef, ...]


class _Struct(
    msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True, kw_only=True
):
    """Base of every block: camelCase keys, unknown keys refused, immutable (each subclass
    repeats frozen=True for type checkers)."""


class PluginFlags(_Struct, frozen=True):
    """flags.plugin: device-plugin settings (GFD ignores them)."""

    pass_device_specs: bool | None = None
    device_list_strategy: str | tuple[str, ...] | None = None
    device_id_strategy: str | None = msgspec.field(default=None, name="deviceIDStrategy")
    cdi_annotation_prefix: str | None = None
    nvidia_ctk_path: str | None = msgspec.field(default=None, name="nvidiaCTKPath")
    container_driver_root: str | None = None
    shared_devices_allocation_policy: str | None = None

    def __post_init__(self) -> None:
        strategies = self.list_strategies
        if strategies is not None:
            if not strategies:
                raise FieldError("deviceListStrategy", [], EXPECTED["deviceListStrategy"])
            many = not isinstance(self.device_list_strategy, str)
            for i, name in enumerate(strategies):
                field = f"deviceListStrategy[{i}]" if many else "deviceListStrategy"
                check_choice(field, name, LIST_STRATEGIES)
        check_choice("deviceIDStrategy", self.device_id_strategy, ID_STRATEGIES)
        check_choice(
            "sharedDevicesAllocationPolicy",
            self.shared_devices_allocation_policy,
            ALLOCATION_POLICIES,
        )

    @property
    def list_strategies(self) -> tuple[str, ...] | None:
        """deviceListStrategy as a tuple (the file may give one string or a list)."""
        value = self.device_list_strategy
        return (value,) if isinstance(value, str) else value


class GfdFlags(_Struct, frozen=True):
    """flags.gfd: feature-discovery settings (the device plugin ignores them)."""

    oneshot: bool | None = None
    no_timestamp: bool | None = None
    sleep_interval: str | None = None
    output_file: str | None = None
    machine_type_file: str | None = None

    def __post_init__(self) -> None:
        check_duration("sleepInterval", self.sleep_interval)


class Flags(_Struct, frozen=True):
    """flags: settings shared by the device plugin and GFD."""

    mig_strategy: str | None = None
    fail_on_init_error: bool | None = None
    mps_root: str | None = None
    nvidia_driver_root: str | None = None
    nvidia_dev_root: str | None = None
    gdrcopy_enabled: bool | None = None
    gds_enabled: bool | None = None
    mofed_enabled: bool | None = None
    use_node_feature_api: bool | None = msgspec.field(default=None, name="useNodeFeatureAPI")
    device_discovery_strategy: str | None = None
    plugin: PluginFlags = msgspec.field(default_factory=PluginFlags)
    gfd: GfdFlags = msgspec.field(default_factory=GfdFlags)

    def __post_init__(self) -> None:
        check_choice("migStrategy", self.mig_strategy, MIG_STRATEGIES)
        discovery = self.device_discovery_strategy
        check_choice("deviceDiscoveryStrategy", discovery, DISCOVERY_STRATEGIES)


class ResourceRule(_Struct, frozen=True):
    """An entry of resources.gpus / resources.mig: devices matching `pattern` become `name`."""

    pattern: str
    name: str

    def __post_init__(self) -> None:
        if not self.pattern:
            raise FieldError("pattern", self.pattern, EXPECTED["pattern"])
        msgspec.structs.force_setattr(self, "name", resource_name("name", self.name))


class Resources(_Struct, frozen=True):
    """resources: custom naming (validated, then dropped at load as upstream does)."""

    gpus: tuple[ResourceRule, ...] = ()
    mig: tuple[ResourceRule, ...] = ()


class ReplicatedResource(_Struct, frozen=True):
    """One entry of sharing.<strategy>.resources."""

    name: str
    replicas: int
    rename: str = ""
    devices: Devices = "all"

    def __post_init__(self) -> None:
        name = resource_name("name", self.name)
        check_servable("name", self.name, name)
        msgspec.structs.force_setattr(self, "name", name)
        if self.rename:
            msgspec.structs.force_setattr(self, "rename", resource_name("rename", self.rename))
        if not 2 <= self.replicas <= MAX_REPLICAS:
            raise FieldError("replicas", self.replicas, EXPECTED["replicas"])
        check_devices(self.devices)

    @property
    def advertised_name(self) -> str:
        return self.rename or self.name


class ReplicatedResources(_Struct, frozen=True):
    """sharing.timeSlicing or sharing.mps."""

    resources: tuple[ReplicatedResource, ...]
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool | None = None

    def __post_init__(self) -> None:
        if not self.resources:
            raise FieldError("resources", [], EXPECTED["timeSlicing.resources"])


class Sharing(_Struct, frozen=True):
    """A block per sharing strategy (core.strategies: its `config_attr`)."""

    time_slicing: ReplicatedResources | None = None
    mps: ReplicatedResources | None = None

    def block(self, strategy: strategies.Strategy) -> ReplicatedResources | None:
        return getattr(self, strategy.config_attr) if strategy.config_attr else None

    @property
    def present(self) -> tuple[strategies.Strategy, ...]:
        """The strategies whose block is set, the one in force first (upstream's rule:
        mps whenever it is present, else timeSlicing)."""
        return tuple(s for s in strategies.sharing() if self.block(s) is not None)

    @property
    def replicated_strategy(self) -> strategies.Strategy:
        """The strategy whose block is in force (whole GPUs when none is set)."""
        return next(iter(self.present), strategies.WHOLE)

    @property
    def replicated(self) -> ReplicatedResources | None:
        """The block in force."""
        return self.block(self.replicated_strategy)

    @property
    def strategy(self) -> str:
        """The name of the sharing strategy, by upstream's rule (the first block with
        replicas > 1), else none."""
        for s in self.present:
            block = self.block(s)
            if block is not None and any(r.replicas > 1 for r in block.resources):
                return s.name
        return strategies.WHOLE.name

    @property
    def fail_requests_greater_than_one(self) -> bool:
        """As set, else the default of the strategy in force (upstream's: true under mps,
        false under time-slicing)."""
        block = self.replicated
        if block is None:
            return False
        if block.fail_requests_greater_than_one is not None:
            return block.fail_requests_greater_than_one
        return self.replicated_strategy.fail_requests_default


class Imex(_Struct, frozen=True):
    channel_ids: tuple[int, ...] | None = msgspec.field(default=None, name="channelIDs")
    required: bool | None = None

    def __post_init__(self) -> None:
        if self.channel_ids not in (None, (), (0,)):
            raise FieldError("channelIDs", list(self.channel_ids or ()), EXPECTED["channelIDs"])


SIZE_EXPECTED = (
    'a size in bytes, not negative, such as "8Gi", "512Mi", "10G" or 1073741824 (units: '
    "Ki Mi Gi Ti Pi, K M G T P)"
)
OFF = "off"


def _size(field: str, value: str | int | None) -> int | None:
    """Bytes of a size given as a Kubernetes quantity or an integer; FieldError if bad."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise FieldError(field, value, SIZE_EXPECTED)
    if isinstance(value, int):
        if value < 0:
            raise FieldError(field, value, SIZE_EXPECTED)
        return value
    try:
        return parse_bytes(value)
    except ValueError:
        raise FieldError(field, value, SIZE_EXPECTED) from None


class MemoryLimitRule(_Struct, frozen=True):
    """memoryIsolation.resources.<name> (gpuslice only): one resource's per-replica limits."""

    hard_limit: str | int | None = None  # a size, or "off": no limit for this resource
    soft_limit: str | int | None = None

    def check(self, at: str) -> None:
        """FieldError naming `at` (the entry) for a size that is not one."""
        if self.hard_limit != OFF:
            _size(f"{at}.hardLimit", self.hard_limit)
        _size(f"{at}.softLimit", self.soft_limit)

    @property
    def off(self) -> bool:
        return self.hard_limit == OFF

    @property
    def hard_bytes(self) -> int | None:
        return None if self.off else _size("hardLimit", self.hard_limit)

    @property
    def soft_bytes(self) -> int:
        return _size("softLimit", self.soft_limit) or 0


class MemoryIsolation(_Struct, frozen=True):
    """memoryIsolation (gpuslice only; NVIDIA's plugin has no such block): per-resource
    overrides of the per-pod GPU memory limits that --memory-isolation enforces."""

    allow_overcommit: bool = False
    resources: dict[str, MemoryLimitRule] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, rule in self.resources.items():
            resource_name("resources", name)
            rule.check(f"resources[{name}]")


class Config(_Struct, frozen=True):
    """A whole v1 config file."""

    version: str = VERSION
    flags: Flags = msgspec.field(default_factory=Flags)
    resources: Resources = msgspec.field(default_factory=Resources)
    sharing: Sharing = msgspec.field(default_factory=Sharing)
    imex: Imex = msgspec.field(default_factory=Imex)
    memory_isolation: MemoryIsolation | None = None  # gpuslice only

    def __post_init__(self) -> None:
        if self.version == "":
            msgspec.structs.force_setattr(self, "version", VERSION)
        if self.version != VERSION:
            raise FieldError("version", self.version, EXPECTED["version"])
