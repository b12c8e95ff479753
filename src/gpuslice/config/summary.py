"""Human and machine views of an effective config (for `gpuslice config validate`)."""

from __future__ import annotations

from typing import Any

import msgspec

from gpuslice.config.flags import with_defaults
from gpuslice.config.v1 import Config


def describe(config: Config, *, complete: bool = False) -> str:
    """A few lines: MIG strategy, sharing strategy, one line per replica rule, device flags."""
    config = config if complete else with_defaults(config)
    flags, plugin, sharing = config.flags, config.flags.plugin, config.sharing
    fail = "true" if sharing.fail_requests_greater_than_one else "false"
    block = sharing.replicated
    lines = [f"migStrategy: {flags.mig_strategy}"]
    if block is None:
        lines.append("sharing: none")
    else:
        lines.append(f"sharing: {sharing.strategy} (failRequestsGreaterThanOne: {fail})")
        for rule in block.resources:
            renamed = f", advertised as {rule.rename}" if rule.rename else ""
            picked = "" if rule.devices == "all" else f", devices {_devices(rule.devices)}"
            lines.append(f"  {rule.name}: {rule.replicas} replicas{renamed}{picked}")
    lines += [
        f"deviceListStrategy: {','.join(plugin.list_strategies or ())}",
        f"deviceIDStrategy: {plugin.device_id_strategy}",
        f"sharedDevicesAllocationPolicy: {plugin.shared_devices_allocation_policy}",
    ]
    limits = config.memory_isolation  # gpuslice only
    if limits is not None:
        over = ", allowOvercommit" if limits.allow_overcommit else ""
        lines.append(f"memoryIsolation: {len(limits.resources)} override(s){over}")
        for name, limit in sorted(limits.resources.items()):
            hard = limit.hard_limit if limit.hard_limit is not None else "its replica's share"
            soft = f", softLimit {limit.soft_limit}" if limit.soft_limit is not None else ""
            lines.append(f"  {name}: hardLimit {hard}{soft}")
    return "\n".join(lines)


def _devices(devices: str | int | tuple[str | int, ...]) -> str:
    if isinstance(devices, tuple):
        return ",".join(str(d) for d in devices)
    return f"{devices} (lowest indexes)" if isinstance(devices, int) else devices


def to_dict(config: Config) -> dict[str, Any]:
    """The config as JSON-ready builtins, keys as in the file (camelCase)."""
    data: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(config))
    if data.get("memoryIsolation") is None:  # gpuslice only: absent, NVIDIA's format stays
        data.pop("memoryIsolation", None)
    return data
