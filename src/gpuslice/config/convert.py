"""The config in core terms, so nothing outside this package reads the schema's structs."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import TypeVar

from gpuslice.config.checks import show
from gpuslice.config.flags import with_defaults
from gpuslice.config.load_rules import superseded
from gpuslice.config.v1 import Config, Devices
from gpuslice.core.container_spec import IMEX_CHANNEL_DEV
from gpuslice.core.errors import HardwareError
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import MIG_MIXED, ReplicaRule, ResourceSettings, SharingPlan
from gpuslice.core.strategies import by_name

T = TypeVar("T")


def resource_settings(config: Config, *, complete: bool = False) -> ResourceSettings:
    """MIG strategy and replica rules: what build_resources needs from the config
    (`complete`: every flag already set, as config.flags.apply_flags leaves it)."""
    config = config if complete else with_defaults(config)
    sharing = config.sharing
    block = sharing.replicated
    entries = block.resources if block else ()
    path = f"sharing.{sharing.replicated_strategy.config_key}"
    rules = tuple(
        ReplicaRule(r.name, r.replicas, r.rename, _devices(r.devices), f"{path}.resources[{i}]")
        for i, r in enumerate(entries)
        if not superseded(entries, i)
    )
    plan = SharingPlan(sharing.strategy, rules, sharing.fail_requests_greater_than_one)
    return ResourceSettings(_set(config.flags.mig_strategy), plan)


def allocate_options(config: Config, *, complete: bool = False) -> AllocateOptions:
    """The flags that shape Allocate answers; the MPS root only while a strategy with
    control daemons is in force."""
    config = config if complete else with_defaults(config)
    flags, plugin = config.flags, config.flags.plugin
    return AllocateOptions(
        list_strategies=_set(plugin.list_strategies),
        id_strategy=_set(plugin.device_id_strategy),
        pass_device_specs=_set(plugin.pass_device_specs),
        dev_root=flags.nvidia_dev_root or _set(flags.nvidia_driver_root),
        cdi_annotation_prefix=_set(plugin.cdi_annotation_prefix),
        gdrcopy_enabled=_set(flags.gdrcopy_enabled),
        gds_enabled=_set(flags.gds_enabled),
        mofed_enabled=_set(flags.mofed_enabled),
        mps_root=_set(flags.mps_root) if by_name(config.sharing.strategy).daemon else "",
        imex_channel_ids=_set(config.imex.channel_ids),
        allocation_policy=_set(plugin.shared_devices_allocation_policy),
    )


def plugin_options(
    config: Config, imex_present: Collection[int], *, complete: bool = False
) -> tuple[AllocateOptions, tuple[str, ...]]:
    """allocate_options under the device plugin's start-up rules, which GPU Feature
    Discovery does not apply, plus warnings. MPS needs mpsRoot and a MIG strategy other
    than mixed (ConfigError); a requested IMEX channel missing from `imex_present` (the
    channels whose device node exists) fails when imex.required (HardwareError) and is
    left out with a warning otherwise."""
    config = config if complete else with_defaults(config)
    flags = config.flags
    mixed = flags.mig_strategy == MIG_MIXED
    by_name(config.sharing.strategy).check_flags(flags.mps_root, mixed, show)
    options = allocate_options(config, complete=True)
    channels, warnings = usable_imex_channels(
        options.imex_channel_ids, imex_present, required=bool(config.imex.required)
    )
    return replace(options, imex_channel_ids=channels), warnings


def usable_imex_channels(
    requested: Sequence[int], present: Collection[int], *, required: bool
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The requested IMEX channels to hand out, and warnings, as upstream decides at
    start: a missing channel fails (HardwareError) when required, else is left out."""
    missing = [c for c in requested if c not in present]
    if missing and required:
        path = IMEX_CHANNEL_DEV.format(missing[0])
        raise HardwareError(
            f"imex.required: IMEX channel {missing[0]} is required but {path} does not exist "
            "on this node; start the IMEX daemon that creates it, or set imex.required "
            "(--imex-required, IMEX_REQUIRED) to false"
        )
    warnings = tuple(
        f"imex.channelIDs: {IMEX_CHANNEL_DEV.format(c)} does not exist on this node; "
        f"channel {c} is left out of every allocation (imex.required is false)"
        for c in missing
    )
    return tuple(c for c in requested if c in present), warnings


def _devices(devices: Devices) -> int | tuple[str, ...] | None:
    if devices == "all":
        return None
    if isinstance(devices, int):
        return devices
    return tuple(str(d) for d in devices)


def _set(value: T | None) -> T:
    assert value is not None  # with_defaults fills every flag that has a default
    return value
