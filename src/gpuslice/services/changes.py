"""One-line descriptions of what the agent serves, for its start and reload log lines."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.resources import Resource


def counts(resources: Iterable[Resource]) -> dict[str, int]:
    """Device count by resource name."""
    return {r.name: len(r.devices) for r in resources}


def served(now: Mapping[str, int]) -> str:
    """`nvidia.com/gpu 16 devices, nvidia.com/mig-1g.5gb 7 devices`, or `nothing`."""
    return ", ".join(f"{name} {now[name]} devices" for name in sorted(now)) or "nothing"


def resource_changes(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    """Per resource, before -> after: `nvidia.com/gpu 16 -> 32 devices`; a resource that
    appears or goes says so; `no resource changed` when the counts are all the same."""
    parts = []
    for name in sorted(before.keys() | after.keys()):
        if name not in before:
            parts.append(f"{name} added with {after[name]} devices")
        elif name not in after:
            parts.append(f"{name} removed ({before[name]} devices)")
        elif before[name] != after[name]:
            parts.append(f"{name} {before[name]} -> {after[name]} devices")
    return ", ".join(parts) or "no resource changed"


def gpus(snapshot: HardwareSnapshot) -> str:
    """`4x Tesla T4` (MIG mode noted), or `no GPUs`."""
    models: dict[str, int] = {}
    for gpu in snapshot.gpus:
        model = gpu.name + (" (MIG enabled)" if gpu.mig_enabled else "")
        models[model] = models.get(model, 0) + 1
    return ", ".join(f"{n}x {model}" for model, n in models.items()) or "no GPUs"
