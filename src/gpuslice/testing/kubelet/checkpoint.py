"""The stand-in's allocation checkpoint, so allocations survive restart().

Written as the kubelet writes kubelet_internal_checkpoint in the device-plugin
directory (Data.PodDeviceEntries with PodUID, ContainerName, ResourceName and
DeviceIDs by NUMA node; Data.RegisteredDevices), so the agent's checkpoint reader
is tested against it. The kubelet keeps no pod names there; the stand-in adds
them under "PodNames" (UID -> pod) for its own restarts, and writes no checksum.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
NO_NUMA = "-1"  # the kubelet's key for devices without topology

# pod -> container -> resource -> device IDs
Allocations = dict[str, dict[str, dict[str, tuple[str, ...]]]]


@dataclass
class Checkpoint:
    allocations: Allocations = field(default_factory=dict)
    resources: set[str] = field(default_factory=set)  # every resource ever registered
    uids: dict[str, str] = field(default_factory=dict)  # pod -> its UID

    def held(self) -> dict[str, set[str]]:
        """resource -> the device IDs admitted pods hold."""
        out: dict[str, set[str]] = {}
        for by_ctr in self.allocations.values():
            for by_res in by_ctr.values():
                for resource, ids in by_res.items():
                    out.setdefault(resource, set()).update(ids)
        return out

    def record(self, pod: str, grants: Iterable[tuple[str, str, tuple[str, ...]]]) -> str:
        """Keep a pod's (container, resource, device IDs) grants; returns its UID."""
        uid = self.uids.setdefault(pod, str(uuid.uuid4()))
        by_ctr = self.allocations.setdefault(pod, {})
        for container, resource, ids in grants:
            by_ctr.setdefault(container, {})[resource] = ids
        return uid

    def forget(self, pod: str) -> bool:
        self.uids.pop(pod, None)
        return self.allocations.pop(pod, None) is not None


def load(path: str) -> Checkpoint:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except FileNotFoundError:
        return Checkpoint()
    names: dict[str, str] = raw.get("PodNames", {})
    state = Checkpoint(resources=set(raw["Data"].get("RegisteredDevices", {})))
    for uid, pod in names.items():  # pods holding no device too
        state.uids[pod] = uid
        state.allocations[pod] = {}
    for entry in raw["Data"].get("PodDeviceEntries", []):
        pod = names[entry["PodUID"]]
        ids = tuple(i for part in entry["DeviceIDs"].values() for i in part)
        by_ctr = state.allocations.setdefault(pod, {})
        by_ctr.setdefault(entry["ContainerName"], {})[entry["ResourceName"]] = ids
    return state


def save(path: str, checkpoint: Checkpoint) -> None:
    """Write atomically (temp file, then rename)."""
    entries = [
        {
            "PodUID": checkpoint.uids[pod],
            "ContainerName": ctr,
            "ResourceName": res,
            "DeviceIDs": {NO_NUMA: list(ids)},
            "AllocResp": "",
        }
        for pod, by_ctr in sorted(checkpoint.allocations.items())
        for ctr, by_res in sorted(by_ctr.items())
        for res, ids in sorted(by_res.items())
    ]
    data = {
        "Data": {
            "PodDeviceEntries": entries,
            "RegisteredDevices": {name: [] for name in sorted(checkpoint.resources)},
        },
        "Checksum": 0,
        "PodNames": {uid: pod for pod, uid in sorted(checkpoint.uids.items())},
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
