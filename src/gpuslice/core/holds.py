"""Devices held back while a container still holds their hardware in another form.

The kubelet counts each allocation under the resource and device ID it was made for.
When a config moves a GPU (or MIG device) to another resource, or turns a whole GPU
into replicas under the same name (or back), the kubelet sees the new devices as free
although a running container still uses that hardware. Such devices are advertised
Unhealthy (held) until the container is gone: `held` says which.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from gpuslice.core.devices import HardwareSnapshot, is_replica, physical_id
from gpuslice.core.resources import AdvertisedDevice, Resource
from gpuslice.core.usage import ContainerDevices

# Index-form IDs ("0", "0:1") are only ours under these names; UUIDs are ours anywhere.
OUR_DOMAIN = "nvidia.com/"


@dataclass(frozen=True, slots=True)
class InUse:
    """One device ID the kubelet has allocated, and the hardware behind it."""

    resource: str
    device_id: str  # as allocated: "GPU-x", "GPU-x::3", a MIG UUID, "0", "0:1"
    gpu_uuid: str
    mig_uuid: str = ""  # "" for a whole GPU or a replica of one


def in_use(
    allocations: Iterable[ContainerDevices],
    snapshot: HardwareSnapshot,
    served: Collection[str] = (),
) -> frozenset[InUse]:
    """The allocated IDs that name a device of this node. Index-form IDs count only
    under `served` names and nvidia.com/ ones (another vendor's plugin may use "0")."""
    lookup: dict[str, tuple[str, str, bool]] = {}  # ID -> (GPU UUID, MIG UUID, is UUID)
    for gpu in snapshot.gpus:
        lookup[gpu.uuid] = (gpu.uuid, "", True)
        lookup[str(gpu.index)] = (gpu.uuid, "", False)
        for mig in gpu.mig_devices:
            lookup[mig.uuid] = (gpu.uuid, mig.uuid, True)
            lookup[f"{gpu.index}:{mig.index}"] = (gpu.uuid, mig.uuid, False)
    out: set[InUse] = set()
    for alloc in allocations:
        ours = alloc.resource in served or alloc.resource.startswith(OUR_DOMAIN)
        for device_id in alloc.device_ids:
            found = lookup.get(physical_id(device_id))
            if found is not None and (found[2] or ours):
                out.add(InUse(alloc.resource, device_id, found[0], found[1]))
    return frozenset(out)


def held(resources: Iterable[Resource], used: Collection[InUse]) -> frozenset[str]:
    """The GPU and MIG UUIDs to advertise Unhealthy: those behind a device of a resource
    whose hardware a container holds in another form: under another resource name, or
    under this name by an ID the resource no longer advertises (unless both are replicas
    of one device: those share by design). Each device is served by one resource, so a
    UUID held here holds no device of another resource."""
    if not used:
        return frozenset()
    out: set[str] = set()
    for resource in resources:
        by_gpu: dict[str, list[AdvertisedDevice]] = {}
        for d in resource.devices:
            by_gpu.setdefault(d.gpu_uuid, []).append(d)
        for u in used:
            if u.gpu_uuid in by_gpu:
                out.update(_conflicts(resource, by_gpu[u.gpu_uuid], u))
    return frozenset(out)


def _conflicts(resource: Resource, on_gpu: list[AdvertisedDevice], u: InUse) -> set[str]:
    mine = u.resource == resource.name
    if mine and resource.device(u.device_id) is not None:
        return set()  # the kubelet counts it against this very list
    out = set()
    for d in on_gpu:
        mig = d.physical_id if d.is_mig else ""
        if u.mig_uuid and mig and u.mig_uuid != mig:
            continue  # another MIG device of the same GPU: isolated hardware
        if mine and u.mig_uuid == mig and is_replica(u.device_id) and is_replica(d.id):
            continue  # a replica count changed: replicas of one device share anyway
        out.add(d.physical_id)
    return out
