"""Device health for the kubelet's DRAResourceHealth stream: every published device,
every time (the kubelet takes a device missing from a message as unknown)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpuslice.core.dra.devices import DraDevice
from gpuslice.core.dra.slices import is_unhealthy

MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool: str
    device: str
    healthy: bool
    since: int  # unix seconds of the last change
    message: str = ""


def health_list(
    devices: Iterable[DraDevice],
    unhealthy: Collection[str],
    *,
    pool: str,
    since: Mapping[str, int],
    reasons: Mapping[str, str] | None = None,
) -> tuple[DeviceHealth, ...]:
    """One entry per device; `since` maps a device name to when its health last changed
    and `reasons` a GPU or MIG UUID to why it is unhealthy."""
    why = reasons or {}
    out = []
    for device in sorted(devices, key=lambda d: d.name):
        bad = is_unhealthy(device, unhealthy)
        message = why.get(device.uuid) or why.get(device.gpu_uuid) or ("unhealthy" if bad else "")
        out.append(
            DeviceHealth(
                pool, device.name, not bad, since.get(device.name, 0), message[:MAX_MESSAGE]
            )
        )
    return tuple(out)
