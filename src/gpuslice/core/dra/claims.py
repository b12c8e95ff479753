"""Claims the kubelet asks this node to prepare: read from the ResourceClaim's allocation,
checked against what the node publishes and what other claims hold, turned into the
devices the kubelet gets back and the claim's own CDI spec.

The kubelet sends only a reference (namespace, name, UID); the allocation and the
config come from the ResourceClaim object (status.allocation.devices.results and
.config). Class configs apply first, then the claim's; a later one wins for the
requests it names (NVIDIA's driver's order). A device another prepared claim holds is
refused unless it is shared: replicated by the node's time-slicing or MPS settings, or
both allocations carry a share ID (consumable capacity), or either has admin access.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.dra.capacity import charged_memory_mib
from gpuslice.core.dra.devices import DraDevice, DraOptions
from gpuslice.core.dra.fields import quantity_mib
from gpuslice.core.dra.opaque import SharingConfig, parse_config
from gpuslice.core.dra.slices import is_unhealthy
from gpuslice.core.errors import ConfigError, GpusliceError
from gpuslice.core.isolation import Limit
from gpuslice.core.mps import DaemonPlan, claim_resource
from gpuslice.core.strategies import by_dra_name

FROM_CLASS, FROM_CLAIM = "FromClass", "FromClaim"


class ClaimError(GpusliceError):
    """A claim this node cannot prepare; one line, returned to the kubelet (the pod's
    events show it)."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None = None
    admin: bool = False
    memory_mib: int | None = None  # consumedCapacity.memory: what the claim was charged


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]  # this driver's only
    configs: tuple[tuple[tuple[str, ...], SharingConfig], ...]  # (requests, config), in order


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None
    admin: bool = False
    # GPU memory the scheduler charged the claim on a shared device (its consumed
    # capacity `memory`), the limit it is held to; None: the whole device's
    memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    spec: str  # the claim's CDI spec file name ("" when none was needed)
    # False between PrepareStarted (recorded before the spec is written) and
    # PrepareCompleted: a claim an agent was killed preparing
    completed: bool = True
    # The memory its pods are held to (--memory-isolation): the pods it was reserved for
    # when prepared, and (GPU UUID, limit) pairs; kept so a restarted agent keeps them
    pods: tuple[str, ...] = ()
    limits: tuple[tuple[str, Limit], ...] = ()
    # MIG instances created for it (--dra-dynamic-mig): (GPU UUID, profile, placement
    # start), recorded PrepareStarted before they are created
    instances: tuple[tuple[str, str, int], ...] = ()
    # Its own MPS control daemon (MPS on MIG devices), recorded PrepareCompleted
    daemon: DaemonPlan | None = None


@dataclass(frozen=True, slots=True)
class ClaimSharing:
    """What the claim's devices need for sharing, from its config and the node's."""

    mps_resource: str | None = None  # the MPS resource whose control daemon serves it
    thread_percentage: int | None = None
    pinned_mib: tuple[tuple[int, int], ...] = ()  # (CUDA ordinal in the claim, MiB)
    interval: str | None = None  # time-slicing interval asked for
    # MPS on MIG devices: the claim's own daemon's devices, (name, memory MiB, pinned MiB
    # or None) in ordinal order; mps_resource is then the daemon's (core.mps.claim_resource)
    own_daemon: tuple[tuple[str, int, int | None], ...] = ()


def parse_claim(obj: Mapping[str, object], ref: ClaimRef, driver: str) -> ClaimAllocation:
    """The allocation of `obj` (a ResourceClaim as JSON) for `driver`. Raises ClaimError
    when it is not the claim the kubelet named, is not allocated, or its config is bad."""
    meta = _map(obj.get("metadata"))
    if meta.get("uid") != ref.uid:
        raise ClaimError(f"claim {ref}: its UID is {meta.get('uid')!r} now, not {ref.uid!r}")
    allocation = _map(_map(obj.get("status")).get("allocation"))
    devices = _map(allocation.get("devices"))
    if not allocation or not devices:
        raise ClaimError(f"claim {ref}: not allocated")
    results = []
    for i, r in enumerate(map(_map, _list(devices.get("results")))):
        if r.get("driver") != driver:
            continue
        try:
            memory = charged_memory_mib(_map(r.get("consumedCapacity")), f"claim {ref}: "
                                        f"status.allocation.devices.results[{i}]")  # fmt: skip
        except ConfigError as exc:
            raise ClaimError(str(exc)) from None
        results.append(
            AllocatedDevice(
                request=str(r.get("request", "")),
                pool=str(r.get("pool", "")),
                device=str(r.get("device", "")),
                share_id=str(r["shareID"]) if r.get("shareID") else None,
                admin=r.get("adminAccess") is True,
                memory_mib=memory,
            )
        )
    entries = [_map(c) for c in _list(devices.get("config"))]
    ordered = [c for c in entries if c.get("source") == FROM_CLASS]
    ordered += [c for c in entries if c.get("source") != FROM_CLASS]
    configs = []
    for i, entry in enumerate(ordered):
        opaque = _map(entry.get("opaque"))
        if opaque.get("driver") != driver:
            continue
        where = f"claim {ref}: config {entry.get('source', '?')}[{i}].opaque.parameters"
        try:
            config = parse_config(opaque.get("parameters"), where)
        except ConfigError as exc:
            raise ClaimError(str(exc)) from None
        requests = tuple(str(r) for r in _list(entry.get("requests")))
        configs.append((requests, config))
    return ClaimAllocation(ref, tuple(results), tuple(configs))


def config_for(claim: ClaimAllocation, request: str) -> SharingConfig | None:
    """The config that applies to `request` (or to its parent, for a subrequest
    "parent/sub"): the last one naming it or naming no request."""
    parent = request.split("/", 1)[0]
    found = None
    for requests, config in claim.configs:
        if not requests or request in requests or parent in requests:
            found = config
    return found


def check_devices(
    claim: ClaimAllocation,
    devices: Mapping[str, DraDevice],
    *,
    pool: str,
    unhealthy: Collection[str],
    prepared: Mapping[str, PreparedClaim],
) -> list[DraDevice]:
    """Our devices of `claim`, in its order; raises ClaimError for a device this node
    does not publish, an unhealthy one, or one another claim holds unshared."""
    out = []
    for alloc in claim.devices:
        device = devices.get(alloc.device)
        if alloc.pool != pool or device is None:
            raise ClaimError(
                f"claim {claim.ref}: device {alloc.pool}/{alloc.device} is not on this node "
                f"(pool {pool})"
            )
        if is_unhealthy(device, unhealthy):
            raise ClaimError(f"claim {claim.ref}: device {device.name} is unhealthy")
        for other in prepared.values():
            if other.ref.uid == claim.ref.uid:
                continue
            for held in other.devices:
                if held.device == device.name and not _may_share(device, alloc, held):
                    raise ClaimError(
                        f"claim {claim.ref}: device {device.name} is prepared for claim "
                        f"{other.ref} ({other.ref.uid}) and is not shared"
                    )
        out.append(device)
    return out


def sharing_for(
    claim: ClaimAllocation, devices: Sequence[DraDevice], *, mps_root: str, claims_root: str = ""
) -> ClaimSharing:
    """What the claim's config asks of its devices, checked against the node's sharing
    (`mps_root`: its MPS resources' root, "" when it shares nothing with MPS;
    `claims_root`: where claims' own daemons go, "" when none can run).
    Raises ClaimError: a config of the wrong kind, MPS on a device the node does not
    share with MPS, MPS devices under two control daemons, a pinned limit above a MIG
    device's memory."""
    mps: set[str] = set()
    daemon: dict[int, tuple[str, int, int | None]] = {}
    threads: int | None = None
    pinned: dict[int, int] = {}
    interval: str | None = None
    order = sorted(range(len(devices)), key=lambda i: _index_key(devices[i].index))
    for alloc, device in zip(claim.devices, devices, strict=True):
        config = config_for(claim, alloc.request)
        if config is None:
            continue
        want = device.served_as.dra_config_kind
        if config.kind != want:
            raise ClaimError(
                f"claim {claim.ref}: request {alloc.request}: {config.kind} does not apply to "
                f"{device.kind} device {device.name}; use {want}"
            )
        strategy = by_dra_name(config.strategy)
        if strategy is None:
            continue
        where = f"claim {claim.ref}: request {alloc.request} asks for {strategy.dra_name}"
        own = strategy.daemon and device.served_as.claim_daemon
        problem = "" if own else strategy.claim_problem(device.serving, device.name, mps_root)
        if own and not claims_root:
            problem = "this node has no MPS root (--mps-root) for its control daemon"
        if problem:
            raise ClaimError(f"{where}, but {problem}")
        if strategy.daemon:
            threads = config.thread_percentage
            ordinal = order.index(devices.index(device))
            limit = config.pinned_per_device_mib.get(
                device.uuid, config.pinned_per_device_mib.get(device.index, config.pinned_mib)
            )
            if limit is not None:
                pinned[ordinal] = limit
            if own:
                mps.add(claim_resource(claim.ref.uid))
                memory = _memory_mib(device)
                if limit is not None and limit > memory:
                    raise ClaimError(f"{where} with a pinned memory limit of {limit} MiB, but "
                                     f"{device.name} has {memory} MiB")  # fmt: skip
                daemon[ordinal] = (device.name, memory, limit)
            else:
                mps.add(device.resource)
        else:
            interval = config.interval
    if len(mps) > 1:
        raise ClaimError(
            f"claim {claim.ref}: its MPS devices are under {len(mps)} control daemons "
            f"({', '.join(sorted(mps))}); a container reaches one"
        )
    return ClaimSharing(
        mps_resource=next(iter(mps), None),
        thread_percentage=threads,
        pinned_mib=tuple(sorted(pinned.items())),
        interval=interval,
        own_daemon=tuple(daemon[i] for i in sorted(daemon)),
    )


def claim_daemon(
    uid: str, sharing: ClaimSharing, devices: Sequence[DraDevice], mps_root: str
) -> DaemonPlan | None:
    """The claim's own MPS daemon: its MIG devices as they are now (`devices`, a created
    partition's instance included), their pinned limits (the device's memory where the
    config sets none) and its thread percentage (100 where none)."""
    if not sharing.own_daemon or sharing.mps_resource is None:
        return None
    by_name = {d.name: d.uuid for d in devices}
    return DaemonPlan(
        resource=sharing.mps_resource,
        root=posixpath.join(mps_root, sharing.mps_resource),
        gpu_uuids=tuple(by_name[name] for name, _, _ in sharing.own_daemon),
        pinned_mib=tuple(mib if pin is None else pin for _, mib, pin in sharing.own_daemon),
        thread_percentage=100 if sharing.thread_percentage is None else sharing.thread_percentage,
    )


def prepared_devices(
    claim: ClaimAllocation,
    devices: Sequence[DraDevice],
    opts: DraOptions,
    toolkit: ToolkitDevices,
) -> tuple[PreparedDevice, ...]:
    """What the kubelet gets back: per device our claim spec's CDI ID, then the NVIDIA
    Container Toolkit's own device (by UUID, else index) where its spec names it: it
    carries the driver's libraries."""
    return tuple(
        PreparedDevice(
            requests=(alloc.request,),
            pool=alloc.pool,
            device=device.name,
            cdi_ids=(
                f"{opts.cdi_kind}={cdi_device_name(claim.ref.uid, device.name)}",
                *_named(toolkit.name_for(device.uuid, device.index)),
            ),
            share_id=alloc.share_id,
            admin=alloc.admin,
            memory_mib=alloc.memory_mib,
        )
        for alloc, device in zip(claim.devices, devices, strict=True)
    )


def allocated_here(obj: Mapping[str, object], driver: str, pool: str) -> ClaimRef | None:
    """The claim's reference when `obj` (a ResourceClaim as JSON) has a device of `driver`
    in `pool` (this node's) allocated; None otherwise."""
    meta = _map(obj.get("metadata"))
    results = _map(_map(_map(obj.get("status")).get("allocation")).get("devices")).get("results")
    here = any(
        r.get("driver") == driver and r.get("pool") == pool for r in map(_map, _list(results))
    )
    fields = (meta.get("namespace"), meta.get("uid"), meta.get("name"))
    if not here or not all(isinstance(f, str) and f for f in fields):
        return None
    return ClaimRef(*(str(f) for f in fields))


def cdi_device_name(claim_uid: str, device: str) -> str:
    """<claimUID>-<device>, as NVIDIA's driver names a claim's CDI devices."""
    return f"{claim_uid}-{device}"


def _named(name: str | None) -> tuple[str, ...]:
    return () if name is None else (name,)


def _may_share(device: DraDevice, mine: AllocatedDevice, held: PreparedDevice) -> bool:
    both_shares = mine.share_id is not None and held.share_id is not None
    return device.shared or both_shares or mine.admin or held.admin


def _memory_mib(device: DraDevice) -> int:
    try:
        return quantity_mib(device.capacity.get("memory"), f"device {device.name}: memory")
    except ConfigError as exc:
        raise ClaimError(str(exc)) from None


def _index_key(index: str) -> tuple[int, ...]:
    return tuple(int(p) for p in index.split(":") if p.isdigit())


def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """The outcome of preparing one claim: its devices, or why it was refused."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
