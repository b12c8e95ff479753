"""The stand-in's allocation checkpoint, so allocations survive restart().

The kubelet keeps the same facts in kubelet_internal_checkpoint in the
device-plugin directory; this file has that name but a format of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

CHECKPOINT_NAME = "kubelet_internal_checkpoint"

# pod -> container -> resource -> device IDs
Allocations = dict[str, dict[str, dict[str, tuple[str, ...]]]]


@dataclass
class Checkpoint:
    allocations: Allocations = field(default_factory=dict)
    resources: set[str] = field(default_factory=set)  # every resource ever registered

    def held(self) -> dict[str, set[str]]:
        """resource -> the device IDs admitted pods hold."""
        out: dict[str, set[str]] = {}
        for by_ctr in self.allocations.values():
            for by_res in by_ctr.values():
                for resource, ids in by_res.items():
                    out.setdefault(resource, set()).update(ids)
        return out

    def record(self, pod: str, grants: Iterable[tuple[str, str, tuple[str, ...]]]) -> None:
        """Keep a pod's (container, resource, device IDs) grants."""
        by_ctr = self.allocations.setdefault(pod, {})
        for container, resource, ids in grants:
            by_ctr.setdefault(container, {})[resource] = ids


def load(path: str) -> Checkpoint:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except FileNotFoundError:
        return Checkpoint()
    return Checkpoint(
        allocations={
            pod: {
                ctr: {res: tuple(ids) for res, ids in by_res.items()}
                for ctr, by_res in by_ctr.items()
            }
            for pod, by_ctr in raw.get("allocations", {}).items()
        },
        resources=set(raw.get("resources", [])),
    )


def save(path: str, checkpoint: Checkpoint) -> None:
    """Write atomically (temp file, then rename)."""
    data = {"allocations": checkpoint.allocations, "resources": sorted(checkpoint.resources)}
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
