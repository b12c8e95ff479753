"""Labels of a node with per-GPU sharing (rules that select devices, docs/labels.md).

GFD labels one replica count per resource group (nvidia.com/gpu.*, nvidia.com/mig-<p>.*).
When a rule selects only some devices of a resource, the group describes the devices
still served under the resource's own name (or, when every device is renamed, the
resource serving the lowest-index one), and each renamed resource that serves part of
the devices gets a group of its own: <name>.count, .replicas, .sharing-strategy,
.product and .memory. A resource whose GPUs have different replica counts is labelled
with the largest (each of its devices is at least 1/replicas of a GPU). A config
without device selection gets GFD's labels unchanged (label_groups).
"""

from __future__ import annotations

from collections.abc import Callable

from gpuslice.core.devices import Gpu
from gpuslice.core.errors import HardwareError
from gpuslice.core.placement import ResourceShare
from gpuslice.core.resources import RESOURCE_PREFIX, AdvertisedDevice, serving
from gpuslice.core.sharing import NONE, ReplicaRule, ResourceSettings, SharingPlan

Warn = Callable[[str], None]
MAX_LABEL_NAME = 63  # the part of a label key after its prefix
_Holders = dict[str, list[tuple[AdvertisedDevice, ResourceShare]]]


def per_gpu(gpus: tuple[Gpu, ...], settings: ResourceSettings) -> dict[str, _Holders] | None:
    """Per resource group, the resources serving its devices; None when no rule selects
    devices (GFD's labels apply) or the selection cannot be served (the plugin refuses
    it and says why)."""
    rules = settings.sharing.rules
    if all(r.devices is None for r in rules) and len({r.name for r in rules}) == len(rules):
        return None
    try:
        served = serving(gpus, settings)
    except HardwareError:
        return None
    out: dict[str, _Holders] = {}
    for name, devices in served.items():
        holders: _Holders = {}
        for dev, where in devices:
            holders.setdefault(where.name, []).append((dev, where))
        out[name] = holders
    return out


def group_plan(view: dict[str, _Holders], plan: SharingPlan) -> SharingPlan:
    """One rule per group that reads as shared, for label_groups: the replicas of the
    resource the group describes, renamed when that is not the group's own name."""
    rules = []
    for name, holders in view.items():
        if not holders:
            continue
        target = name if name in holders else next(iter(holders))
        replicas = max(w.replicas for _, w in holders[target])
        if replicas > 1:
            rename = "" if target == name else target
            rules.append(ReplicaRule(name, replicas, rename))
    return SharingPlan(plan.strategy, tuple(rules), plan.fail_requests_greater_than_one)


def renamed_groups(
    view: dict[str, _Holders],
    gpus: tuple[Gpu, ...],
    strategy: str,
    product: Callable[[tuple[str, ...]], str],
    warn: Warn,
) -> dict[str, str]:
    """A group for each renamed resource that serves part of a group's devices;
    `product` names a model from its parts (GPU name, "MIG", profile)."""
    by_uuid = {g.uuid: g for g in gpus}
    labels: dict[str, str] = {}
    for name, holders in view.items():
        if len(holders) < 2:
            continue
        for target, devices in holders.items():
            if target == name:
                continue
            if len(target.removeprefix(RESOURCE_PREFIX) + ".sharing-strategy") > MAX_LABEL_NAME:
                warn(f"{target}: the name is too long for label keys; it gets no labels")
                continue
            first = devices[0][0]
            replicas = max(w.replicas for _, w in devices)
            values = {
                "count": len(devices),
                "replicas": replicas,
                "sharing-strategy": strategy if replicas > 1 else NONE,
                "product": product(_parts(first, by_uuid[first.gpu_uuid])),
                "memory": first.memory_mib,
            }
            labels |= {f"{target}.{k}": str(v) for k, v in values.items()}
    return labels


def _parts(dev: AdvertisedDevice, gpu: Gpu) -> tuple[str, ...]:
    if not dev.is_mig:
        return (gpu.name,)
    mig = next(m for m in gpu.mig_devices if m.uuid == dev.physical_id)
    return (gpu.name, "MIG", mig.profile)
