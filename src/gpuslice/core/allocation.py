"""Preferred allocation and request validation for one resource.

Whole GPUs use the NVLink-aware best set; replicas and MIG devices use one
greedy loop whose order is the policy: `distributed` spreads picks over
physical GPUs (distinct GPUs first, then the least loaded), `packed` fills
the most loaded GPU first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from gpuslice.core.devices import is_replica
from gpuslice.core.errors import InvalidRequest
from gpuslice.core.resources import AdvertisedDevice, Resource
from gpuslice.core.response import PACKED
from gpuslice.core.topology import Topology


def known_devices(resource: Resource, ids: Sequence[str], what: str) -> list[AdvertisedDevice]:
    """The devices behind `ids`; InvalidRequest for an unknown or repeated ID."""
    out: list[AdvertisedDevice] = []
    seen: set[str] = set()
    for device_id in ids:
        dev = resource.device(device_id)
        if dev is None:
            raise InvalidRequest(f"{what}: unknown device {device_id!r} for {resource.name}")
        if device_id in seen:
            raise InvalidRequest(f"{what}: device {device_id!r} listed more than once")
        seen.add(device_id)
        out.append(dev)
    return out


def preferred_allocation(
    resource: Resource,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    policy: str,
    topology: Topology | None = None,
) -> list[str]:
    """The devices the kubelet should take for one container request."""
    if size <= 0:
        raise InvalidRequest(f"allocation size must be at least 1, got {size}")
    avail = known_devices(resource, available, "available devices")
    known_devices(resource, must_include, "must-include devices")
    offered = set(available)  # one set: a request may list thousands of IDs
    missing = next((d for d in must_include if d not in offered), None)
    if missing is not None:
        raise InvalidRequest(f"must-include device {missing!r} is not among the available ones")
    if len(must_include) > size:
        raise InvalidRequest(
            f"{len(must_include)} must-include devices exceed the allocation size {size}"
        )
    if size > len(avail):
        raise InvalidRequest(
            f"not enough available devices to satisfy allocation: {size} requested, "
            f"{len(avail)} available for {resource.name}"
        )
    if topology is not None and resource.whole_gpus:
        return topology.best_set([d.id for d in avail], list(must_include), size)
    return _greedy(avail, list(must_include), size, resource, packed=policy == PACKED)


def _greedy(
    avail: list[AdvertisedDevice],
    required: list[str],
    size: int,
    resource: Resource,
    *,
    packed: bool,
) -> list[str]:
    total = resource.devices_per_gpu
    free = Counter(d.gpu_uuid for d in avail)
    picks = Counter(resource.device(d).gpu_uuid for d in required)  # type: ignore[union-attr]
    queues: dict[str, list[str]] = {}
    order: dict[str, int] = {}  # ties go to the lowest GPU index, whatever the kubelet's order
    taken = set(required)
    mixed = len({d.replicas for d in resource.devices}) > 1
    for dev in avail:
        order.setdefault(dev.gpu_uuid, dev.gpu_index)
        if dev.id not in taken:
            queues.setdefault(dev.gpu_uuid, []).append(dev.id)
    for q in queues.values():
        q.reverse()  # pop() from the end keeps the available order
    out = list(required)
    while len(out) < size:
        candidates = [g for g, q in queues.items() if q]

        def key(g: str) -> tuple[int | Fraction, ...]:
            if packed:
                return (-(total[g] - free[g] + picks[g]), order[g])
            used = total[g] - free[g] + picks[g]
            # GPUs with different replica counts (per-GPU sharing): the smallest share
            # in use first, so the GPUs with fewer replicas do not fill up first.
            load = Fraction(used, total[g]) if mixed else used
            return (picks[g], load, order[g])

        gpu = min(candidates, key=key)
        out.append(queues[gpu].pop())
        picks[gpu] += 1
    return out


def validate_allocate(resource: Resource, ids: Sequence[str]) -> list[AdvertisedDevice]:
    """Check one container's Allocate request; return its devices."""
    if not ids:
        raise InvalidRequest(f"empty container request for {resource.name}: no device IDs")
    devices = known_devices(resource, ids, "invalid request")
    if (
        resource.fail_requests_greater_than_one
        and resource.serving.shares
        and len(ids) > 1
        and any(is_replica(i) for i in ids)
    ):
        block = resource.serving.config_key
        raise InvalidRequest(
            f'invalid allocation request for "{resource.name}": maximum request size for '
            f"shared resources is 1; found {len(ids)}. Request 1 {resource.name} per container, "
            f"or set sharing.{block}.failRequestsGreaterThanOne: false to allow more"
        )
    return devices
