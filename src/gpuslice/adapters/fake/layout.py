"""Whole-node rules of a node file: unique identities and NVLink groups."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from gpuslice.adapters.fake.fields import Fields
from gpuslice.core.devices import Gpu

NVLINK_KEYS = ("gpus", "links")


def check_unique(top: Fields, gpus: list[Gpu]) -> None:
    """No two GPUs or MIG devices share a UUID; no two GPUs a minor or bus ID."""
    owner: dict[tuple[str, object], int] = {}
    for gpu in gpus:
        slots = [(mig.gi, mig.ci) for mig in gpu.mig_devices]
        for gi, ci in slots:
            if slots.count((gi, ci)) > 1:
                top.fail("gpus", f"GPU {gpu.index} has two MIG devices with gi {gi}, ci {ci}")
        identities = [("uuid", gpu.uuid), ("minor", gpu.minor), ("pci_bus_id", gpu.pci_bus_id)]
        identities += [("uuid", mig.uuid) for mig in gpu.mig_devices]
        for what, value in identities:
            first = owner.setdefault((what, value), gpu.index)
            if first != gpu.index or identities.count((what, value)) > 1:
                top.fail("gpus", f"GPU {gpu.index} repeats {what} {value} (used by GPU {first})")


def apply_nvlinks(top: Fields, gpus: list[Gpu]) -> list[Gpu]:
    """Each `nvlink` entry joins every pair of its GPUs (by index) with `links` links."""
    links: dict[tuple[int, int], int] = {}
    for path, raw in top.items("nvlink"):
        entry = Fields(raw, path, top.source, NVLINK_KEYS)
        count = entry.integer("links", minimum=1)
        members: list[int] = []
        for member_path, member in entry.items("gpus", required=True):
            if isinstance(member, bool) or not isinstance(member, int):
                entry.fail(member_path, "expected a GPU index")
            if not 0 <= member < len(gpus) or member in members:
                entry.fail(member_path, f"expected a distinct GPU index 0..{len(gpus) - 1}")
            members.append(member)
        if len(members) < 2:
            entry.fail(entry.at("gpus"), "expected at least two GPU indexes")
        for a, b in combinations(sorted(members), 2):
            links[(a, b)] = links.get((a, b), 0) + count
    peers: dict[int, list[tuple[str, int]]] = {g.index: [] for g in gpus}
    for (a, b), count in sorted(links.items()):
        peers[a].append((gpus[b].uuid, count))
        peers[b].append((gpus[a].uuid, count))
    return [replace(g, nvlinks=tuple(peers[g.index])) for g in gpus]
