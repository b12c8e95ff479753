"""The ResourceSlices of this node: one pool named after the node, every slice carrying
the pool's generation and slice count, split at the API's device limit (128 per slice,
64 when a slice carries taints or consumes counters). Shared counters (--dra-dynamic-mig)
go in slices of their own, at most 8 counter sets each. Unhealthy devices (a GPU's
failure covers its MIG devices and partitions) are withdrawn, or kept with a NoSchedule
taint under `taint_unhealthy`.

The objects are what the API server is sent (resource.k8s.io/v1), as plain JSON.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gpuslice.core.dra.capacity import shared_capacity
from gpuslice.core.dra.devices import MAX_ATTRIBUTES, DraDevice, DraOptions, Json

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_TAINTED = 64  # also when devices consume counters
MAX_COUNTER_SETS = 8  # per slice, in slices without devices
UNHEALTHY_TAINT = "unhealthy"  # key <driver>/unhealthy


@dataclass(frozen=True, slots=True)
class SliceChange:
    """One event of a watch on this node's slices: ADDED, MODIFIED, DELETED, BOOKMARK or
    OPENED (the watch was answered), the slice's name and resourceVersion."""

    kind: str
    name: str
    resource_version: str | None


def is_unhealthy(device: DraDevice, unhealthy: Collection[str]) -> bool:
    """Its own UUID is marked, or its GPU's is (a MIG device of a failed GPU)."""
    return device.uuid in unhealthy or device.gpu_uuid in unhealthy


def device_json(device: DraDevice, opts: DraOptions, *, unhealthy: bool = False) -> Json:
    out: Json = {"name": device.name}
    capacity: dict[str, Json] = {k: {"value": v} for k, v in device.capacity.items()}
    if opts.consumable_shares and device.shared:
        out["allowMultipleAllocations"] = True
        capacity = shared_capacity(device)  # every capacity with a policy: N claims fit
    # The API refuses a device with more than MAX_ATTRIBUTES attributes and capacities
    # together: every capacity is kept (the scheduler counts them), then the attributes
    # in their order (the device's own first, the node's common ones last).
    room = max(MAX_ATTRIBUTES - len(capacity), 0)
    out["attributes"] = dict(list(device.attributes.items())[:room])
    out["capacity"] = capacity
    if unhealthy:
        taint = {"key": f"{opts.driver}/{UNHEALTHY_TAINT}", "effect": "NoSchedule"}
        out["taints"] = [taint]
    return out


def published(
    devices: Iterable[DraDevice], unhealthy: Collection[str], opts: DraOptions
) -> list[Json]:
    """The device entries to publish, in name order."""
    out = []
    for device in sorted(devices, key=lambda d: d.name):
        bad = is_unhealthy(device, unhealthy)
        if bad and not opts.taint_unhealthy:
            continue
        out.append(device_json(device, opts, unhealthy=bad))
    return out


def build_slices(
    entries: Sequence[Json],
    *,
    node: str,
    opts: DraOptions,
    generation: int,
    counter_sets: Sequence[Json] = (),
) -> list[Json]:
    """The slices holding `entries` (at least one, so the pool exists when empty) and
    `counter_sets` (--dra-dynamic-mig): those in slices of their own, MAX_COUNTER_SETS
    each, first; devices that consume counters go MAX_TAINTED to a slice."""
    limited = counter_sets or any("taints" in e for e in entries)
    size = MAX_TAINTED if limited else MAX_DEVICES
    chunks: list[tuple[str, list[Json]]] = [
        ("sharedCounters", list(counter_sets[i : i + MAX_COUNTER_SETS]))
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS)
    ]
    chunks += [("devices", list(entries[i : i + size])) for i in range(0, len(entries), size)]
    if not entries and not counter_sets:
        chunks.append(("devices", []))
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node, opts, i)},
            "spec": {
                "driver": opts.driver,
                "nodeName": node,
                "pool": {
                    "name": node,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                key: chunk,
            },
        }
        for i, (key, chunk) in enumerate(chunks)
    ]


def slice_name(node: str, opts: DraOptions, index: int) -> str:
    """<node>-<driver>-<index>: a DNS subdomain, stable so updates replace in place."""
    return f"{node}-{opts.driver}-{index}"
