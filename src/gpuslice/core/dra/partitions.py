"""Partitionable MIG devices (--dra-dynamic-mig, Kubernetes DRAPartitionableDevices): every
placement a GPU's MIG profiles allow is published as a device that consumes the GPU's
shared counters, as NVIDIA's DRA driver publishes them.

A GPU's counter set (`<gpu name>-counter-set`) holds its multiprocessors, engines and
memory (the largest any profile has) and one `memory-slice-<i>` per memory slice. A
partition consumes its profile's values and the memory slices of its placement; the whole
GPU consumes every counter. So the scheduler never hands out two overlapping placements,
nor a partition together with the whole GPU. Names carry the profile ID and the start:
gpu-0000-07-00-0-mig-1g5gb-19-3.

Which GPUs DRA partitions (`owned`): MIG-capable GPUs with MIG on (or of an architecture
that turns it on without a reset) whose devices no resource kept on the device-plugin API
holds; one GPU is served by one of the two at a time. The whole GPU is published where
MIG mode can be turned off without a reset (Hopper and later) only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.dra.devices import (
    MIG,
    DraDevice,
    Json,
    gpu_name,
    name_label,
    partition_attributes,
    whole_gpu,
)
from gpuslice.core.mig import MEMORY_SLICES, RESETLESS_ARCHITECTURES, MigProfileSpec, Placement
from gpuslice.core.resources import Resource, mig_names
from gpuslice.core.sharing import NONE, ResourceSettings

ENGINES = ("copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines")
CAPACITY = {"copy-engines": "copyEngines", "jpeg-engines": "jpegEngines",
            "ofa-engines": "ofaEngines"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Partition:
    """A published device of a partitioned GPU: one placement of a profile, or (profile
    "", placement None) the whole GPU."""

    device: DraDevice
    counter_set: str
    consumes: Mapping[str, int]  # counter -> amount
    profile: str = ""
    gi_profile_id: int = -1
    placement: Placement | None = None

    @property
    def whole(self) -> bool:
        return self.placement is None


@dataclass(frozen=True, slots=True)
class PartitionedGpu:
    gpu: Gpu
    counters: Mapping[str, int]  # the counter set's capacities
    partitions: tuple[Partition, ...]

    @property
    def counter_set(self) -> str:
        return counter_set_name(self.gpu)


def counter_set_name(gpu: Gpu) -> str:
    return f"{gpu_name(gpu)}-counter-set"


def partition_name(gpu: Gpu, spec: MigProfileSpec, placement: Placement) -> str:
    return f"{gpu_name(gpu)}-mig-{name_label(spec.name)}-{spec.gi_profile_id}-{placement.start}"


def owned(
    snapshot: HardwareSnapshot,
    device_plugin: Iterable[Resource],
    *,
    ours: Collection[str] = (),
) -> tuple[Gpu, ...]:
    """The GPUs DRA partitions: MIG-capable, MIG on or able to turn it on without a reset,
    and none of whose devices (other than the MIG devices `ours`, which DRA created) a
    resource kept on the device-plugin API holds."""
    held = {
        adv.gpu_uuid
        for res in device_plugin
        for adv in res.devices
        if not (adv.is_mig and adv.physical_id in ours)
    }
    return tuple(
        g
        for g in snapshot.gpus
        if g.mig_capable
        and (g.mig_enabled or g.architecture in RESETLESS_ARCHITECTURES)
        and g.uuid not in held
    )


def partition_gpu(
    snapshot: HardwareSnapshot, gpu: Gpu, table: Sequence[MigProfileSpec]
) -> PartitionedGpu:
    """The counter set and devices of `gpu` from its MIG profile table."""
    counters: dict[str, int] = {}
    for spec in table:
        for key, value in _amounts(spec).items():
            counters[key] = max(counters.get(key, 0), value)
    counters.update({f"memory-slice-{i}": 1 for i in range(MEMORY_SLICES)})
    name = counter_set_name(gpu)
    out: list[Partition] = []
    if gpu.architecture in RESETLESS_ARCHITECTURES:
        out.append(Partition(whole_gpu(snapshot, gpu), name, dict(counters)))
    for spec in table:
        amounts = {k: v for k, v in _amounts(spec).items() if v}
        # the capacity a MIG device has (core.dra.devices' names), the counters' values
        capacity = {CAPACITY.get(k, k): str(v) for k, v in amounts.items() if k != "memory"}
        capacity["memory"] = f"{spec.memory_mib}Mi"
        for placement in spec.placements:
            used = {f"memory-slice-{i}": 1 for i in range(placement.start, placement.end)}
            device = DraDevice(
                name=partition_name(gpu, spec, placement), uuid="", gpu_uuid=gpu.uuid,
                kind=MIG, index=f"{gpu.index}", resource="", sharing=NONE, replicas=1,
                paths=(gpu.device_path,),
                attributes=partition_attributes(snapshot, gpu, spec.name),
                capacity=capacity,
            )  # fmt: skip
            out.append(
                Partition(
                    device, name, {**amounts, **used}, spec.name, spec.gi_profile_id, placement
                )
            )
    out.sort(key=lambda p: p.device.name)
    return PartitionedGpu(gpu, counters, tuple(out))


def _amounts(spec: MigProfileSpec) -> dict[str, int]:
    e = spec.engines
    values = (e.copy, e.decoder, e.encoder, e.jpeg, e.ofa)
    return {
        "multiprocessors": spec.multiprocessors,
        **dict(zip(ENGINES, values, strict=True)),
        "memory": spec.memory_mib,
    }


def _quantity(counter: str, value: int) -> Json:
    return {"value": f"{value}Mi" if counter == "memory" else str(value)}


def counter_set_json(gpu: PartitionedGpu) -> Json:
    counters = {k: _quantity(k, v) for k, v in gpu.counters.items() if v}
    return {"name": gpu.counter_set, "counters": counters}


@dataclass(frozen=True, slots=True)
class Partitioned:
    """What DRA partitions: GPU UUID -> its counters and devices."""

    gpus: Mapping[str, PartitionedGpu] = field(default_factory=dict)

    @property
    def by_name(self) -> dict[str, Partition]:
        return {p.device.name: p for g in self.gpus.values() for p in g.partitions}

    def served(self, devices: Iterable[DraDevice]) -> list[DraDevice]:
        """`devices` (the node's others) with the partitioned GPUs' devices in place of
        theirs (their MIG devices as they are now are not published)."""
        others = [d for d in devices if d.gpu_uuid not in self.gpus]
        return others + [p.device for p in self.by_name.values()]

    def publish(self, entries: Iterable[Json]) -> tuple[list[Json], list[Json]]:
        """The device entries with their consumption, and the counter sets."""
        sets = [counter_set_json(self.gpus[g]) for g in sorted(self.gpus)]
        return with_counters(entries, self.by_name), sets


def offered(
    tables: Mapping[str, Sequence[MigProfileSpec]],
    settings: ResourceSettings,
    kept: Collection[str],
) -> dict[str, tuple[MigProfileSpec, ...]]:
    """The profile tables less the profiles whose MIG devices the device-plugin API would
    serve under a name `kept` there: an instance DRA made of one would be served twice."""
    return {
        gpu: tuple(p for p in table if not mig_names(settings, p.name) & frozenset(kept))
        for gpu, table in tables.items()
    }


def partition_node(
    snapshot: HardwareSnapshot,
    gpus: Iterable[Gpu],
    tables: Mapping[str, Sequence[MigProfileSpec]],
    settings: ResourceSettings,
    kept: Collection[str],
) -> Partitioned:
    """The partitions of `gpus` (`owned`), of the profiles their tables have that are
    `offered` (none the node's `settings` would serve under a name `kept` on the
    device-plugin API)."""
    tables = offered(tables, settings, kept)
    return Partitioned(
        {g.uuid: partition_gpu(snapshot, g, tables[g.uuid]) for g in gpus if tables.get(g.uuid)}
    )


def with_counters(entries: Iterable[Json], partitions: Mapping[str, Partition]) -> list[Json]:
    """The device entries, each partition's with its consumesCounters."""
    out = []
    for entry in entries:
        found = partitions.get(str(entry["name"]))
        if found is not None:
            counters = {k: _quantity(k, v) for k, v in found.consumes.items() if v}
            entry = {**entry, "consumesCounters": [
                {"counterSet": found.counter_set, "counters": counters}]}  # fmt: skip
        out.append(entry)
    return out
