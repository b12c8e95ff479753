"""How the kubelet picks and allocates devices for one container at pod admission."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from gpuslice.core.response import ContainerAllocation
from gpuslice.testing.kubelet.endpoint import DialledPlugin
from gpuslice.testing.kubelet.records import AdmissionError, DeviceState


def pick(available: Sequence[str], preferred: Sequence[str], needed: int) -> tuple[str, ...]:
    """The plugin's preference is advice: keep its available IDs (first `needed`,
    no repeats), then fill up from the available ones in order."""
    chosen: list[str] = []
    allowed = set(available)
    for dev in (*preferred, *available):
        if len(chosen) == needed:
            break
        if dev in allowed and dev not in chosen:
            chosen.append(dev)
    return tuple(chosen)


async def allocate_container(
    ep: DialledPlugin | None,
    devices: Iterable[DeviceState],
    resource: str,
    count: int,
    taken: Collection[str],
) -> tuple[tuple[str, ...], ContainerAllocation]:
    """Choose `count` of the resource's healthy `devices` not in `taken` and call
    Allocate for them on its endpoint `ep`."""
    if ep is None:
        raise AdmissionError(resource, f"cannot allocate unregistered device {resource}")
    # A disconnected plugin's devices were all marked Unhealthy, as the kubelet marks them.
    healthy = sorted(d.id for d in devices if d.healthy)
    if not healthy:
        raise AdmissionError(
            resource, f"no healthy devices present; cannot allocate unhealthy devices {resource}"
        )
    available = [d for d in healthy if d not in taken]
    if len(available) < count:
        raise AdmissionError(
            resource,
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {count}, Available: {len(available)}",
        )
    if ep.stopped:  # a client was disconnected after this endpoint connected
        raise AdmissionError(resource, f"endpoint {ep.endpoint} for {resource} has been stopped")
    preferred: list[str] = []
    if ep.options.get_preferred_allocation_available:
        preferred = await ep.preferred_allocation(available, [], count)
    chosen = pick(available, preferred, count)
    (allocation,) = await ep.allocate([chosen])
    if ep.options.pre_start_required:
        await ep.pre_start(chosen)
    return chosen, allocation
