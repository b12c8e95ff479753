"""core.dra.partitions and the slices that carry them (--dra-dynamic-mig): one device per
MIG placement consuming the GPU's shared counters, the whole GPU consuming them all, and
the API's limits (8 counter sets per slice, 64 devices per slice when counters are used,
counters and devices in slices of their own). Whether claims fit is checked the way the
scheduler checks it, from the published JSON only."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from collections.abc import Iterable

from gpuslice.adapters.fake.mig_tables import A100_40GB, H100_80GB
from gpuslice.core.devices import Gpu
from gpuslice.core.dra.devices import DraOptions, Json
from gpuslice.core.dra.partitions import (
    PartitionedGpu,
    counter_set_json,
    offered,
    owned,
    partition_gpu,
    with_counters,
)
from gpuslice.core.dra.slices import build_slices, published
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import MIG_MIXED, MIG_NONE, MIG_SINGLE, ReplicaRule

from . import builders as b

OPTS = DraOptions(dynamic_mig=True)
UNITS = {"": 1, "Mi": 2**20}


def hopper(index: int) -> Gpu:
    return dataclasses.replace(b.gpu(index, mig_enabled=False), architecture="Hopper")


def pool(*gpus: PartitionedGpu, node: str = "node-a") -> list[Json]:
    """The slices the node publishes for these partitioned GPUs."""
    by_name = {p.device.name: p for g in gpus for p in g.partitions}
    devices = [p.device for p in by_name.values()]
    entries = with_counters(published(devices, frozenset(), OPTS), by_name)
    sets = [counter_set_json(g) for g in gpus]
    return build_slices(entries, node=node, opts=OPTS, generation=1, counter_sets=sets)


def quantity(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi)?", text).groups()  # type: ignore[union-attr]
    return int(number) * UNITS[unit or ""]


def fits(slices: list[Json], names: Iterable[str]) -> bool:
    """The scheduler's counter check: the devices' consumption, summed per counter set,
    stays within every counter's value (written from the API's rules, not the agent's)."""
    sets: dict[str, dict[str, int]] = {}
    devices: dict[str, Json] = {}
    for s in slices:
        spec: dict = s["spec"]  # type: ignore[assignment]
        for cs in spec.get("sharedCounters", []):
            sets[cs["name"]] = {k: quantity(v["value"]) for k, v in cs["counters"].items()}
        for d in spec.get("devices", []):
            devices[d["name"]] = d
    used: Counter[tuple[str, str]] = Counter()
    for name in names:
        for c in devices[name]["consumesCounters"]:  # type: ignore[attr-defined]
            for key, value in c["counters"].items():
                used[(c["counterSet"], key)] += quantity(value["value"])
    return all(amount <= sets[s][k] for (s, k), amount in used.items())


def test_every_placement_is_a_device_with_nvidias_names_and_the_whole_gpu_on_hopper() -> None:
    gpu = partition_gpu(b.snapshot(hopper(0)), hopper(0), H100_80GB)
    placements = sum(len(spec.placements) for spec in H100_80GB)
    assert len(gpu.partitions) == placements + 1
    names = [p.device.name for p in gpu.partitions]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", n) for n in names)
    assert "gpu-0000-07-00-0-mig-1g10gb-19-3" in names
    assert "gpu-0000-07-00-0" in names  # the whole GPU
    one = next(p for p in gpu.partitions if p.device.name.endswith("-mig-3g40gb-9-4"))
    attrs = one.device.attributes
    assert attrs["type"] == {"string": "mig"}
    assert attrs["profile"] == {"string": "3g.40gb"}
    assert attrs["parentUUID"] == {"string": b.gpu_uuid(0)}
    assert one.consumes["memory-slice-4"] == one.consumes["memory-slice-7"] == 1
    assert "memory-slice-3" not in one.consumes
    assert one.device.capacity["copyEngines"] == "3"  # named as a MIG device's capacity
    assert "memory-slice-4" not in one.device.capacity


def test_overlapping_placements_and_a_partition_beside_the_whole_gpu_never_fit() -> None:
    gpu = partition_gpu(b.snapshot(hopper(0)), hopper(0), H100_80GB)
    slices = pool(gpu)
    parts = [p for p in gpu.partitions if p.placement is not None]
    whole = next(p for p in gpu.partitions if p.placement is None)
    for one, two in itertools.combinations(parts, 2):
        assert one.placement is not None
        assert two.placement is not None
        pair = [one.device.name, two.device.name]
        if one.placement.overlaps(two.placement):
            assert not fits(slices, pair), pair
        elif one.profile != two.profile or one.profile.endswith("gb"):  # not 1g+me twice
            assert fits(slices, pair), pair
        assert not fits(slices, [whole.device.name, one.device.name])
    assert fits(slices, [whole.device.name])
    sevens = [p.device.name for p in parts if p.gi_profile_id == 19]
    assert len(sevens) == 7
    assert fits(slices, sevens)
    four, three = (f"gpu-0000-07-00-0-mig-{n}" for n in ("4g40gb-5-0", "3g40gb-9-4"))
    assert fits(slices, [four, three])  # 4g and 3g coexist


def test_an_ampere_gpu_publishes_its_partitions_but_not_the_whole_gpu() -> None:
    gpu = b.gpu(0, mig_enabled=True)
    parted = partition_gpu(b.snapshot(gpu), gpu, A100_40GB)
    assert all(p.placement is not None for p in parted.partitions)
    assert len(parted.partitions) == sum(len(s.placements) for s in A100_40GB)


def test_nine_gpus_respect_the_apis_limits_in_one_pool() -> None:
    gpus = [hopper(i) for i in range(9)]
    snapshot = b.snapshot(*gpus)
    slices = pool(*(partition_gpu(snapshot, g, H100_80GB) for g in gpus))
    counters = [s for s in slices if "sharedCounters" in s["spec"]]  # type: ignore[operator]
    devices = [s for s in slices if "devices" in s["spec"]]  # type: ignore[operator]
    assert len(counters) == 2
    assert len(counters) + len(devices) == len(slices)
    set_names = set()
    for s in slices:
        spec: dict = s["spec"]  # type: ignore[assignment]
        assert spec["pool"]["resourceSliceCount"] == len(slices)
        assert not ("sharedCounters" in spec and "devices" in spec)
        assert len(spec.get("sharedCounters", [])) <= 8
        assert len(spec.get("devices", [])) <= 64
        set_names |= {cs["name"] for cs in spec.get("sharedCounters", [])}
    assert len(set_names) == 9
    consumed = {
        c["counterSet"] for s in devices for d in s["spec"]["devices"]  # type: ignore[index]
        for c in d["consumesCounters"]
    }  # fmt: skip
    assert consumed == set_names  # every reference resolves within the pool


def test_gpus_held_by_the_device_plugin_are_not_partitioned() -> None:
    gpus = (b.gpu(0, profiles=["1g.5gb", "2g.10gb"]), b.gpu(1, mig_enabled=True), b.gpu(2))
    snapshot = b.snapshot(*gpus)
    resources = build_resources(snapshot, b.settings(MIG_MIXED))
    kept = [r for r in resources if r.name == "nvidia.com/mig-1g.5gb"]
    assert [g.index for g in owned(snapshot, kept)] == [1]  # 2: MIG off on Ampere
    assert [g.index for g in owned(snapshot, [])] == [0, 1]
    ours = {gpus[0].mig_devices[0].uuid}  # the 1g.5gb is one DRA created for a claim
    assert [g.index for g in owned(snapshot, kept, ours=ours)] == [0, 1]


def test_no_profile_is_offered_whose_devices_the_device_plugin_would_serve() -> None:
    """An instance DRA made of such a profile would show up on the device-plugin API too."""
    tables = {"GPU-h": H100_80GB}

    def names(settings: object, kept: list[str]) -> set[str]:
        return {p.name for p in offered(tables, settings, kept)["GPU-h"]}  # type: ignore[arg-type]

    every = {p.name for p in H100_80GB}
    mixed = b.settings(MIG_MIXED)
    assert names(mixed, ["nvidia.com/mig-1g.10gb"]) == every - {"1g.10gb"}
    assert names(mixed, ["nvidia.com/mig-1g.10gb.me"]) == every - {"1g.10gb+me"}
    assert names(mixed, ["nvidia.com/gpu"]) == every  # whole GPUs only, under mixed
    assert names(b.settings(MIG_SINGLE), ["nvidia.com/gpu"]) == set()
    assert names(b.settings(MIG_NONE), ["nvidia.com/gpu"]) == every  # MIG GPUs served whole
    renamed = b.settings(MIG_MIXED, ReplicaRule("nvidia.com/mig-2g.20gb", 2, rename="small"))
    assert names(renamed, ["small"]) == every - {"2g.20gb"}
    assert names(renamed, []) == every
