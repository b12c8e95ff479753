"""Which physical devices (GPU or MIG UUIDs) one health event touches.

An advertised device is unhealthy when its GPU's UUID or its own physical ID is
marked, so marking a GPU covers every replica and every MIG device on it, in
every resource. A MIG-scoped event ("gi=<id> ci=<id>" in its detail) marks only
the MIG device with that GPU instance and compute instance, unless its XID is
GPU-wide (GPU_WIDE_XIDS: off the bus, uncontained ECC, GSP, ...), which marks the
whole GPU whatever instance the event names; upstream scopes every XID by GI/CI.
An event whose GPU the backend could not name (gpu_uuid "") marks every GPU, as
upstream does.
"""

from __future__ import annotations

from collections.abc import Collection

from gpuslice.core.devices import Gpu, HardwareSnapshot, HealthEvent
from gpuslice.core.health_state import FATAL_XIDS

# XIDs that fault the whole GPU, so no single MIG device can hold them: the
# built-in fatal list (GPUSLICE_HEALTH_FATAL_XIDS changes severity, not scope).
GPU_WIDE_XIDS = FATAL_XIDS


def mig_scope(detail: str) -> tuple[int, int] | None:
    """(GPU instance, compute instance) named in an event's detail, if both are."""
    found: dict[str, int] = {}
    for token in detail.split():
        key, sep, value = token.partition("=")
        if sep and key in ("gi", "ci") and value.isascii() and value.isdigit():
            found[key] = int(value)
    if "gi" in found and "ci" in found:
        return found["gi"], found["ci"]
    return None


def find_gpu(snapshot: HardwareSnapshot, uuid: str) -> Gpu | None:
    """The GPU with this UUID, or the GPU holding the MIG device with it."""
    for gpu in snapshot.gpus:
        if gpu.uuid == uuid or any(m.uuid == uuid for m in gpu.mig_devices):
            return gpu
    return None


def every_gpu(snapshot: HardwareSnapshot) -> frozenset[str]:
    return frozenset(g.uuid for g in snapshot.gpus)


def fault_scope(
    event: HealthEvent,
    snapshot: HardwareSnapshot,
    advertised: Collection[str] = (),
    gpu_wide: Collection[int] = GPU_WIDE_XIDS,
) -> frozenset[str]:
    """The devices an xid or lost event marks; empty when it names no device here.

    `advertised` holds the physical IDs served now: a MIG-scoped event on a GPU
    that is served whole (MIG strategy none) marks the whole GPU, as upstream does.
    An XID in `gpu_wide` marks the whole GPU even when it names a MIG device.
    """
    if not event.gpu_uuid:
        return every_gpu(snapshot)
    gpu = find_gpu(snapshot, event.gpu_uuid)
    if gpu is None:
        return frozenset()
    if event.kind == "xid" and event.xid in gpu_wide:
        return frozenset({gpu.uuid})
    if event.gpu_uuid != gpu.uuid:  # the backend named the MIG device itself
        return frozenset({event.gpu_uuid})
    scope = mig_scope(event.detail) if event.kind == "xid" else None
    if scope is None or not gpu.mig_devices:
        return frozenset({gpu.uuid})
    mig = next((m for m in gpu.mig_devices if (m.gi, m.ci) == scope), None)
    if mig is None:
        return frozenset()  # an instance this snapshot does not hold
    if gpu.uuid in advertised and mig.uuid not in advertised:
        return frozenset({gpu.uuid})
    return frozenset({mig.uuid})


def recovery_scope(event: HealthEvent, snapshot: HardwareSnapshot) -> frozenset[str]:
    """The devices a "recovered" event may clear: the GPU and its MIG devices."""
    if not event.gpu_uuid:
        return frozenset()
    gpu = find_gpu(snapshot, event.gpu_uuid)
    if gpu is None:
        return frozenset({event.gpu_uuid})
    if event.gpu_uuid != gpu.uuid:
        return frozenset({event.gpu_uuid})
    return frozenset({gpu.uuid, *(m.uuid for m in gpu.mig_devices)})
