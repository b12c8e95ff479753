"""Who uses what: kubelet allocations joined with per-process GPU samples.

Replicas and MIG devices fold onto the physical GPU they share. What cannot be
known is said, never guessed: a process in no pod, or in a pod holding no device
where it runs, is unattributed; a process that could belong to more than one
container (two containers of its pod on one device, or a device ID listed for
several) is reported once for all of them, each named; utilisation that NVML does
not give is None with the reason.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuslice.core.devices import Gpu, HardwareSnapshot, MigDevice, is_replica, physical_id
from gpuslice.core.usage import (
    UTIL_UNREADABLE,
    CheckpointEntry,
    ContainerDevices,
    GpuSample,
    ProcessOwner,
    ProcessSample,
    ProcessUse,
)

MIB = 1024 * 1024
NO_POD = "no_pod"  # the process is in no pod (host or system process)
NO_DEVICE = "pod_without_device"  # its pod holds no device (that we can match) where it runs


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container's use of one physical GPU, for one resource."""

    gpu_index: int
    gpu_uuid: str
    model_name: str
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]  # the allocated IDs on this GPU (replica, MIG or GPU IDs)
    memory_used_bytes: int  # by processes attributed to this container alone
    memory_peak_bytes: int  # the most seen over the samples while it lived
    allocated_share: float | None  # of the GPU: 1/replicas each, a MIG slice's memory share
    used_share: float  # memory_used_bytes over the GPU's memory
    utilisation: float | None  # SM, 0..1, summed over its processes
    utilisation_absent: str  # why utilisation is None ("" when it is not)
    processes: int
    shared_with: tuple[str, ...] = ()  # "namespace/pod/container" it cannot be told from
    pod_uid: str = ""  # from the kubelet's checkpoint; "" when it has none
    pids: tuple[int, ...] = ()  # its processes' host PIDs on this GPU, most memory first
    # Where memory_used_bytes comes from: "processes" (NVML's per-process list, summed) or
    # "cgroup" (the driver's currentUsed of the pod's memory limit: exact).
    memory_source: str = "processes"

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.namespace, self.pod, self.container, self.resource, self.gpu_uuid)


@dataclass(frozen=True, slots=True)
class SharedUsage:
    """Processes that belong to one of several containers, and nothing says which."""

    gpu_index: int
    gpu_uuid: str
    model_name: str
    namespace: str
    pod: str
    containers: tuple[str, ...]  # "namespace/pod/container", sorted
    memory_used_bytes: int
    processes: int


@dataclass(frozen=True, slots=True)
class UnattributedUsage:
    """Processes of one GPU that belong to no container, by reason (NO_POD, NO_DEVICE)."""

    gpu_index: int
    gpu_uuid: str
    model_name: str
    reason: str
    memory_used_bytes: int
    processes: int


@dataclass(frozen=True, slots=True)
class GpuUsage:
    gpu_index: int
    gpu_uuid: str
    model_name: str
    memory_total_bytes: int
    memory_used_bytes: int  # as the GPU reports it, else the sum of its processes
    utilisation: float | None  # 0..1
    utilisation_absent: str
    processes: int
    error: str = ""  # what could not be read on this GPU in this sample


@dataclass(frozen=True, slots=True)
class Attribution:
    containers: tuple[ContainerUsage, ...] = ()
    shared: tuple[SharedUsage, ...] = ()
    unattributed: tuple[UnattributedUsage, ...] = ()
    gpus: tuple[GpuUsage, ...] = ()

    def peaks(self) -> dict[tuple[str, str, str, str, str], int]:
        return {c.key: c.memory_peak_bytes for c in self.containers}


def with_pod_uids(
    allocations: Iterable[ContainerDevices], entries: Iterable[CheckpointEntry]
) -> tuple[ContainerDevices, ...]:
    """Give each allocation its pod UID from the checkpoint entry holding the same
    container, resource and device IDs (device IDs are exclusive per container)."""
    uids = {(e.container, e.resource, frozenset(e.device_ids)): e.pod_uid for e in entries}
    out = []
    for a in allocations:
        uid = uids.get((a.container, a.resource, frozenset(a.device_ids)), a.pod_uid)
        out.append(a if uid == a.pod_uid else _replace_uid(a, uid))
    return tuple(out)


def _replace_uid(a: ContainerDevices, uid: str) -> ContainerDevices:
    return ContainerDevices(a.namespace, a.pod, a.container, a.resource, a.device_ids, uid)


@dataclass
class _Entry:
    alloc: ContainerDevices
    gpu: Gpu
    ids: list[str]
    targets: set[str]  # GPU or MIG UUIDs its processes run on
    share: float | None
    procs: list[ProcessUse]
    absent: str = ""

    @property
    def name(self) -> str:
        return f"{self.alloc.namespace}/{self.alloc.pod}/{self.alloc.container}"


def attribute(
    snapshot: HardwareSnapshot,
    sample: ProcessSample,
    allocations: Sequence[ContainerDevices],
    allocatable: Mapping[str, Sequence[str]],
    owners: Mapping[int, ProcessOwner],
    peaks: Mapping[tuple[str, str, str, str, str], int] | None = None,
) -> Attribution:
    """Join one sample. `allocatable`: resource -> every device ID the kubelet has (for
    the replica count); `peaks`: the previous result's peaks (keys of gone containers
    are simply not carried)."""
    lookup = _device_lookup(snapshot)
    replicas = Counter((res, physical_id(i)) for res, ids in allocatable.items() for i in ids)
    entries = _entries(allocations, lookup, replicas)
    by_target: dict[str, list[_Entry]] = defaultdict(list)
    for e in entries:
        for t in e.targets:
            by_target[t].append(e)
    shared: dict[tuple[str, tuple[str, ...]], list[ProcessUse]] = defaultdict(list)
    shared_by: dict[tuple[str, tuple[str, ...]], _Entry] = {}  # one of them, for its pod
    loose: dict[tuple[str, str], list[ProcessUse]] = defaultdict(list)
    gpus = []
    for gs in sample.gpus:
        gpu = snapshot.gpu_by_uuid(gs.uuid)
        if gpu is None:
            continue
        gpus.append(_gpu_usage(gpu, gs))
        if gs.error:  # nothing was read there: what its holders use is unknown this time
            for e in entries:
                if e.gpu.uuid == gpu.uuid:
                    e.absent = UTIL_UNREADABLE
        for dev in gs.devices:
            holders = by_target.get(dev.uuid, [])
            for e in holders:
                e.absent = e.absent or dev.util_absent
            for proc in dev.processes:
                owner = owners.get(proc.pid)
                if owner is None:
                    loose[(gpu.uuid, NO_POD)].append(proc)
                    continue
                mine = [e for e in holders if e.alloc.pod_uid == owner.pod_uid]
                if not mine:
                    loose[(gpu.uuid, NO_DEVICE)].append(proc)
                elif len(mine) == 1:
                    mine[0].procs.append(proc)
                else:
                    names = tuple(sorted({e.name for e in mine}))
                    shared[(gpu.uuid, names)].append(proc)
                    shared_by[(gpu.uuid, names)] = mine[0]
    flags: dict[tuple[str, str], set[str]] = defaultdict(set)  # (gpu, name) -> others
    for gpu_uuid, names in shared:
        for n in names:
            flags[(gpu_uuid, n)].update(o for o in names if o != n)
    for ids in _shared_ids(entries).values():
        for e in ids:
            flags[(e.gpu.uuid, e.name)].update(o.name for o in ids if o.name != e.name)
    prev = peaks or {}
    containers = tuple(
        _container_usage(e, tuple(sorted(flags.get((e.gpu.uuid, e.name), ()))), prev)
        for e in entries
    )
    return Attribution(
        containers=containers,
        shared=tuple(
            _shared_usage(shared_by[k], k[1], procs) for k, procs in sorted(shared.items())
        ),
        unattributed=tuple(
            UnattributedUsage(
                gpu.index,
                gpu.uuid,
                gpu.name,
                reason,
                sum(p.memory_bytes for p in procs),
                len(procs),
            )
            for (gpu_uuid, reason), procs in sorted(loose.items())
            for gpu in (snapshot.gpu_by_uuid(gpu_uuid),)
            if gpu is not None
        ),
        gpus=tuple(gpus),
    )


def with_cgroup_usage(result: Attribution, used: Mapping[tuple[str, str], int]) -> Attribution:
    """Per-pod memory from the driver's limits: `used` maps (pod UID, GPU UUID) to the
    currentUsed of the pod's limit there. It replaces the process sum of the pod's one
    container on that GPU (with several, the pod's total cannot be split: left as is)."""
    if not used:
        return result
    per_pod = Counter((c.pod_uid, c.gpu_uuid) for c in result.containers)
    totals = {g.gpu_uuid: g.memory_total_bytes for g in result.gpus}
    out = []
    for c in result.containers:
        key = (c.pod_uid, c.gpu_uuid)
        if c.pod_uid and key in used and per_pod[key] == 1:
            total = totals.get(c.gpu_uuid, 0)
            bytes_ = used[key]
            c = replace(
                c,
                memory_used_bytes=bytes_,
                memory_peak_bytes=max(c.memory_peak_bytes, bytes_),
                used_share=bytes_ / total if total else c.used_share,
                memory_source="cgroup",
            )
        out.append(c)
    return replace(result, containers=tuple(out))


def _device_lookup(snapshot: HardwareSnapshot) -> dict[str, tuple[Gpu, MigDevice | None]]:
    """Every way a device ID names a device: UUIDs and the index strategy's "0", "0:1"."""
    out: dict[str, tuple[Gpu, MigDevice | None]] = {}
    for gpu in snapshot.gpus:
        out[gpu.uuid] = out[str(gpu.index)] = (gpu, None)
        for mig in gpu.mig_devices:
            out[mig.uuid] = out[f"{gpu.index}:{mig.index}"] = (gpu, mig)
    return out


def _entries(
    allocations: Sequence[ContainerDevices],
    lookup: Mapping[str, tuple[Gpu, MigDevice | None]],
    replicas: Counter[tuple[str, str]],
) -> list[_Entry]:
    """One entry per (container, resource, physical GPU); unknown device IDs are skipped."""
    entries: dict[tuple[ContainerDevices, str], _Entry] = {}
    for alloc in allocations:
        for device_id in alloc.device_ids:
            found = lookup.get(physical_id(device_id))
            if found is None:
                continue
            gpu, mig = found
            share = _share(alloc.resource, device_id, gpu, mig, replicas)
            e = entries.get((alloc, gpu.uuid))
            if e is None:
                e = entries[(alloc, gpu.uuid)] = _Entry(alloc, gpu, [], set(), 0.0, [])
            e.ids.append(device_id)
            e.targets.add(gpu.uuid if mig is None else mig.uuid)
            e.share = None if e.share is None or share is None else e.share + share
    return list(entries.values())


def _share(
    resource: str,
    device_id: str,
    gpu: Gpu,
    mig: MigDevice | None,
    replicas: Counter[tuple[str, str]],
) -> float | None:
    if mig is not None:
        whole = mig.memory_mib / gpu.memory_mib if gpu.memory_mib else None
    else:
        whole = 1.0
    if not is_replica(device_id) or whole is None:
        return whole
    count = replicas.get((resource, physical_id(device_id)), 0)
    return whole / count if count else None  # the kubelet no longer lists it: unknown


def _shared_ids(entries: Sequence[_Entry]) -> dict[str, list[_Entry]]:
    """Device IDs listed for more than one container (the kubelet hands an init
    container's devices on to the pod's app containers)."""
    holders: dict[str, list[_Entry]] = defaultdict(list)
    for e in entries:
        for device_id in e.ids:
            holders[f"{e.alloc.resource}|{device_id}"].append(e)
    return {k: v for k, v in holders.items() if len({e.name for e in v}) > 1}


def _container_usage(
    e: _Entry, shared_with: tuple[str, ...], peaks: Mapping[tuple[str, str, str, str, str], int]
) -> ContainerUsage:
    used = sum(p.memory_bytes for p in e.procs)
    total = e.gpu.memory_mib * MIB
    utils = [p.sm_util for p in e.procs]
    absent = e.absent or ("" if all(u is not None for u in utils) else UTIL_UNREADABLE)
    util = None if absent else min(1.0, sum(u for u in utils if u is not None))
    a = e.alloc
    key = (a.namespace, a.pod, a.container, a.resource, e.gpu.uuid)
    return ContainerUsage(
        gpu_index=e.gpu.index,
        gpu_uuid=e.gpu.uuid,
        model_name=e.gpu.name,
        namespace=a.namespace,
        pod=a.pod,
        container=a.container,
        resource=a.resource,
        device_ids=tuple(e.ids),
        memory_used_bytes=used,
        memory_peak_bytes=max(used, peaks.get(key, 0)),
        allocated_share=e.share,
        used_share=used / total if total else 0.0,
        utilisation=util,
        utilisation_absent=absent,
        processes=len(e.procs),
        shared_with=shared_with,
        pod_uid=a.pod_uid,
        pids=tuple(p.pid for p in sorted(e.procs, key=lambda p: (-p.memory_bytes, p.pid))),
    )


def _shared_usage(e: _Entry, names: tuple[str, ...], procs: Sequence[ProcessUse]) -> SharedUsage:
    return SharedUsage(
        gpu_index=e.gpu.index,
        gpu_uuid=e.gpu.uuid,
        model_name=e.gpu.name,
        namespace=e.alloc.namespace,
        pod=e.alloc.pod,
        containers=names,
        memory_used_bytes=sum(p.memory_bytes for p in procs),
        processes=len(procs),
    )


def _gpu_usage(gpu: Gpu, gs: GpuSample) -> GpuUsage:
    procs = [p for d in gs.devices for p in d.processes]
    used = gs.memory_used_bytes
    return GpuUsage(
        gpu_index=gpu.index,
        gpu_uuid=gpu.uuid,
        model_name=gpu.name,
        memory_total_bytes=gpu.memory_mib * MIB,
        memory_used_bytes=sum(p.memory_bytes for p in procs) if used is None else used,
        utilisation=gs.utilisation,
        utilisation_absent=gs.util_absent if gs.utilisation is None else "",
        processes=len(procs),
        error=gs.error,
    )
