"""A DRA claim's GPU memory limits: from its consumable `memory` request where it has one,
else NVIDIA's MpsConfig pinned limits, else its shares of a replicated GPU.

Read from the ResourceClaim as the API returns it (JSON). The memory a claim holds on a
device is, first found:

1. `status.allocation.devices.results[].consumedCapacity.memory`: what the scheduler
   allocated (Kubernetes DRAConsumableCapacity);
2. the request's `capacity.requests.memory` (`spec.devices.requests[].exactly` in v1,
   the request itself in v1beta1): what the claim asked for;
3. MpsConfig `defaultPerDevicePinnedMemoryLimit` (by UUID or index), then
   `defaultPinnedDeviceMemoryLimit`;
4. on a replicated GPU, its memory / replicas times the shares consumed (1 by default).

A whole unshared GPU and a MIG device carry no limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.dra.claims import ClaimAllocation, config_for
from gpuslice.core.dra.devices import DraDevice
from gpuslice.core.isolation import MIB, Limit, MemoryPolicy
from gpuslice.core.quantity import parse_bytes

MAX_ITEMS = 256  # results, requests and reservations read from one claim


def claim_pods(obj: Mapping[str, object]) -> tuple[str, ...]:
    """The UIDs of the pods the claim is reserved for (status.reservedFor)."""
    status = _map(obj.get("status"))
    return tuple(
        str(r["uid"])
        for r in map(_map, _list(status.get("reservedFor")))
        if r.get("resource") == "pods" and isinstance(r.get("uid"), str)
    )


def requested_memory(obj: Mapping[str, object]) -> dict[str, int]:
    """Request name -> bytes of memory the claim asked for per device. What the scheduler
    charged (consumedCapacity) is read once, by core.dra.claims.parse_claim, into each
    allocated device's `memory_mib`."""
    out: dict[str, int] = {}
    for r in map(_map, _list(_map(_map(obj.get("spec")).get("devices")).get("requests"))):
        body = _map(r.get("exactly")) or r
        size = _size(_map(_map(body.get("capacity")).get("requests")).get("memory"))
        if size is not None and isinstance(r.get("name"), str):
            out[str(r["name"])] = size
    return out


def consumed_shares(obj: Mapping[str, object], driver: str) -> dict[tuple[str, str], int]:
    """(request, device) -> shares consumed (consumable `shares` capacity)."""
    devices = _map(_map(_map(obj.get("status")).get("allocation")).get("devices"))
    out = {}
    for r in map(_map, _list(devices.get("results"))):
        shares = _map(r.get("consumedCapacity")).get("shares")
        count = _size(shares)
        if count and r.get("driver") == driver:
            out[(str(r.get("request")), str(r.get("device")))] = count
    return out


def claim_limits(
    obj: Mapping[str, object],
    claim: ClaimAllocation,
    devices: Sequence[DraDevice],
    snapshot: HardwareSnapshot,
    policy: MemoryPolicy,
    driver: str,
) -> dict[str, Limit]:
    """GPU UUID -> the claim's limit there, summed over its devices."""
    asked = requested_memory(obj)
    shares = consumed_shares(obj, driver)
    out: dict[str, Limit] = {}
    for alloc, device in zip(claim.devices, devices, strict=True):
        gpu = snapshot.gpu_by_uuid(device.gpu_uuid)
        rule = policy.rule(device.resource)
        if gpu is None or not device.served_as.memory_limits or (rule is not None and rule.off):
            continue
        hard = (
            alloc.memory_mib * MIB
            if alloc.memory_mib is not None
            else asked.get(alloc.request, asked.get(alloc.request.split("/", 1)[0]))
        )
        config = config_for(claim, alloc.request)
        if hard is None and config is not None:
            pinned = config.pinned_per_device_mib.get(
                device.uuid, config.pinned_per_device_mib.get(device.index, config.pinned_mib)
            )
            hard = None if pinned is None else pinned * MIB
        if hard is None and device.shared:
            count = shares.get((alloc.request, device.name), 1)
            hard = rule.hard if rule and rule.hard is not None else _share(gpu.memory_mib, device)
            hard *= count
        if hard is None:
            continue
        soft = min(rule.soft, hard) if rule is not None else 0
        held = out.get(gpu.uuid)
        out[gpu.uuid] = Limit(hard, soft) if held is None else held + Limit(hard, soft)
    return out


def _share(memory_mib: int, device: DraDevice) -> int:
    return memory_mib * MIB // max(device.replicas, 1)


def _size(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and len(value) <= 64:
        try:
            return parse_bytes(value)
        except ValueError:
            return None
    return None


def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[object]:
    return list(value[:MAX_ITEMS]) if isinstance(value, list) else []
