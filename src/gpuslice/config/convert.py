"""The config in core terms, so nothing outside this package reads the schema's structs."""

from __future__ import annotations

from typing import TypeVar

from gpuslice.config.flags import with_defaults
from gpuslice.config.v1 import Config, Devices
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import MPS, ReplicaRule, ResourceSettings, SharingPlan

T = TypeVar("T")


def resource_settings(config: Config) -> ResourceSettings:
    """MIG strategy and replica rules: what build_resources needs from the config."""
    config = with_defaults(config)
    sharing = config.sharing
    block = sharing.replicated
    rules = tuple(
        ReplicaRule(r.name, r.replicas, r.rename, _devices(r.devices))
        for r in (block.resources if block else ())
    )
    plan = SharingPlan(sharing.strategy, rules, sharing.fail_requests_greater_than_one)
    return ResourceSettings(_set(config.flags.mig_strategy), plan)


def allocate_options(config: Config) -> AllocateOptions:
    """The flags that shape Allocate answers; the MPS root only while MPS is in force."""
    config = with_defaults(config)
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
        mps_root=_set(flags.mps_root) if config.sharing.strategy == MPS else "",
        imex_channel_ids=_set(config.imex.channel_ids),
        allocation_policy=_set(plugin.shared_devices_allocation_policy),
    )


def _devices(devices: Devices) -> int | tuple[str, ...] | None:
    if devices == "all":
        return None
    if isinstance(devices, int):
        return devices
    return tuple(str(d) for d in devices)


def _set(value: T | None) -> T:
    assert value is not None  # with_defaults fills every flag that has a default
    return value
