"""Hardware snapshot + settings -> the resources advertised to the kubelet.

Follows upstream naming: whole GPUs and single-strategy MIG devices are
nvidia.com/gpu, mixed-strategy MIG devices are nvidia.com/mig-<profile> with
'+' turned into '.', and replicas are "<uuid>::<n>" devices under the rule's
name or its rename. A rule may select some devices of its resource (per-GPU
sharing, core.placement); the others stay whole under their own name. A resource
with no devices is not advertised.

Under the mixed strategy only GPU-instance-sized MIG profiles (compute slices
equal GPU slices) have a resource, as upstream; a device with a smaller compute
instance ("1c.3g.20gb") is a HardwareError, and an empty MIG-enabled GPU only
gets a warning (layout_warnings), as does a sharing rule that names no resource of
the node. MPS on a node with a MIG-enabled GPU is a HardwareError, as upstream.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpuslice.core.devices import Gpu, HardwareSnapshot, MigDevice, replica_id
from gpuslice.core.errors import HardwareError
from gpuslice.core.placement import ResourceShare, place
from gpuslice.core.sharing import (
    GPU_RESOURCE,
    MIG_MIXED,
    MIG_NONE,
    MIG_SINGLE,
    NONE,
    ResourceSettings,
)
from gpuslice.core.strategies import WHOLE, Strategy, by_name, of_device

RESOURCE_PREFIX = "nvidia.com/"
_COMPUTE_SLICES = re.compile(r"\d+c\.")  # "1c." in "1c.3g.20gb"
# The MIG profile attributes NVML names (+me, +me.all, +gfx, -me), '+' read as '.'.
MIG_ATTRIBUTES = (".me", ".me.all", ".gfx", "-me")
_MIG_RESOURCE = re.compile(
    re.escape(RESOURCE_PREFIX)
    + r"mig-[1-9][0-9]*g\.[1-9][0-9]*gb"
    + f"(?:{'|'.join(map(re.escape, MIG_ATTRIBUTES))})?"
)


@dataclass(frozen=True, slots=True)
class AdvertisedDevice:
    """One device as the kubelet sees it (a GPU, a MIG device or a replica)."""

    id: str  # kubelet device ID, annotated for replicas
    physical_id: str  # GPU or MIG UUID behind it
    gpu_uuid: str  # the physical GPU that holds it
    index: str  # "0" for a GPU, "0:1" for a MIG device
    paths: tuple[str, ...]
    numa_node: int | None
    memory_mib: int
    replicas: int = 1  # shares of physical_id advertised in this resource

    @property
    def gpu_index(self) -> int:
        return int(self.index.split(":", 1)[0])

    @property
    def is_mig(self) -> bool:
        return ":" in self.index

    @property
    def served_as(self) -> Strategy:
        """How the device itself is served (a MIG slice or whole), beside its sharing."""
        return of_device(self.is_mig)


@dataclass(frozen=True, slots=True)
class Resource:
    name: str
    devices: tuple[AdvertisedDevice, ...]
    sharing: str = NONE  # the node's sharing strategy's name when this resource is replicated
    fail_requests_greater_than_one: bool = False
    _by_id: dict[str, AdvertisedDevice] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )
    _per_gpu: Counter[str] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=Counter
    )
    # The strategy `sharing` names, resolved once rather than per Allocate.
    serving: Strategy = field(init=False, repr=False, compare=False, hash=False, default=WHOLE)

    @property
    def socket_name(self) -> str:
        return socket_name(self.name)

    @property
    def replicated(self) -> bool:
        return any(d.replicas > 1 for d in self.devices)

    @property
    def whole_gpus(self) -> bool:
        """True when every device is a full, unshared GPU (topology-aware path)."""
        return not any(d.is_mig or d.replicas > 1 for d in self.devices)

    def device(self, device_id: str) -> AdvertisedDevice | None:
        return self._by_id.get(device_id)

    @property
    def devices_per_gpu(self) -> Counter[str]:
        """How many of this resource's devices each physical GPU holds."""
        return self._per_gpu

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {d.id: d for d in self.devices})
        object.__setattr__(self, "_per_gpu", Counter(d.gpu_uuid for d in self.devices))
        object.__setattr__(self, "serving", by_name(self.sharing))


def socket_name(resource_name: str) -> str:
    """nvidia.com/gpu -> nvidia-gpu.sock; nvidia.com/mig-1g.5gb -> nvidia-mig-1g.5gb.sock."""
    short = resource_name.removeprefix(RESOURCE_PREFIX).replace("/", "-")
    return f"nvidia-{short}.sock"


def mig_resource_name(profile: str) -> str:
    return f"{RESOURCE_PREFIX}mig-{profile.replace('+', '.')}"


def mig_names(settings: ResourceSettings, profile: str) -> frozenset[str]:
    """The names a MIG device of `profile` would be advertised under by these settings: its
    base resource and each rename of it (none under the none strategy, which serves MIG
    GPUs whole)."""
    if settings.mig_strategy == MIG_NONE:
        return frozenset()
    base = GPU_RESOURCE if settings.mig_strategy == MIG_SINGLE else mig_resource_name(profile)
    renamed = (r.advertised_name for r in settings.sharing.rules if r.name == base)
    return frozenset((base, *renamed))


def servable_name(name: str) -> bool:
    """True when some GPU can have resource `name` (prefixed): nvidia.com/gpu, or the
    mixed strategy's nvidia.com/mig-<g>g.<m>gb with an optional NVML attribute."""
    return name == GPU_RESOURCE or bool(_MIG_RESOURCE.fullmatch(name))


def compute_sliced(mig: MigDevice) -> bool:
    """True when the device's compute instance is smaller than its GPU instance."""
    return bool(_COMPUTE_SLICES.match(mig.profile)) or 0 < mig.ci_slices < mig.gi_slices


def layout_warnings(gpus: Iterable[Gpu], settings: ResourceSettings | str) -> tuple[str, ...]:
    """What is logged, without failing, about serving `settings` (or a MIG strategy
    alone) on these GPUs: under the mixed strategy a MIG-enabled GPU without MIG
    devices, as upstream; and each sharing rule that matches no device here."""
    if isinstance(settings, str):
        settings = ResourceSettings(mig_strategy=settings)
    gpus = tuple(gpus)
    empty = tuple(
        f"migStrategy mixed: MIG-enabled GPU {g.index} ({g.uuid}) has no MIG devices; "
        "nothing is advertised from it"
        for g in gpus
        if settings.mig_strategy == MIG_MIXED and g.mig_enabled and not g.mig_devices
    )
    return empty + unmatched_rule_warnings(gpus, settings)


def unmatched_rule_warnings(gpus: Iterable[Gpu], settings: ResourceSettings) -> tuple[str, ...]:
    """One warning per sharing rule whose resource this node does not have under its
    MIG strategy (the rule shares nothing; upstream skips it silently), and per device
    selection this node cannot honour in full (a reference it lacks, a count larger
    than it has: core.placement)."""
    rules = settings.sharing.rules
    if not rules:
        return ()
    gpus = tuple(gpus)
    try:
        base = _base_devices(gpus, settings.mig_strategy)
        selection = place(base, settings.sharing, mig_aliases(gpus)).warnings
    except HardwareError:
        return ()  # build_resources reports the layout itself
    present = sorted(name for name, devices in base.items() if devices)
    here = ", ".join(present) or "no resources"
    return (
        tuple(
            f"sharing: {name} matches no device of this node (migStrategy "
            f"{settings.mig_strategy}; it has {here}); nothing is shared under that name"
            for name in dict.fromkeys(r.name for r in rules)
            if name not in present
        )
        + selection
    )


def build_resources(snapshot: HardwareSnapshot, settings: ResourceSettings) -> tuple[Resource, ...]:
    """The resources to advertise, sorted by name, each device list in index order.
    Raises HardwareError when the layout breaks the MIG strategy's rules, when MPS meets
    a MIG-enabled GPU, or when the per-GPU selection is contradictory (core.placement)."""
    plan = settings.sharing
    plan.serving.check_gpus(snapshot.gpus)
    base = _base_devices(snapshot.gpus, settings.mig_strategy)
    placed = place(base, plan, mig_aliases(snapshot.gpus)).placed
    grouped: dict[str, list[AdvertisedDevice]] = {}
    replicated: set[str] = set()
    for devices in base.values():
        for dev in devices:
            where = placed[dev.id]
            target = grouped.setdefault(where.name, [])
            if where.replicas == 1:
                target.append(dev)
                continue
            replicated.add(where.name)
            target.extend(
                replace(dev, id=replica_id(dev.physical_id, n), replicas=where.replicas)
                for n in range(where.replicas)
            )
    for name, devs in grouped.items():
        _check_list_size(name, devs)
    return tuple(
        Resource(
            name=name,
            devices=tuple(devs),
            sharing=plan.strategy if name in replicated else NONE,
            fail_requests_greater_than_one=plan.fail_requests_greater_than_one,
        )
        for name, devs in sorted(grouped.items())
        if devs
    )


# The kubelet reads ListAndWatch with gRPC's default receive limit: a longer message is
# dropped by the kubelet, and the resource is never served.
KUBELET_RECEIVE_LIMIT = 4 * 1024 * 1024
_LONGEST_HEALTH = len("Unhealthy")


def _varint_bytes(value: int) -> int:
    value &= (1 << 64) - 1  # a negative int64 takes ten bytes
    return max(1, (value.bit_length() + 6) // 7)


def _field_bytes(length: int) -> int:
    """A length-delimited field (tag under 16): tag, length, payload."""
    return 1 + _varint_bytes(length) + length


def list_and_watch_bytes(devices: Iterable[AdvertisedDevice]) -> int:
    """The serialized size of a ListAndWatchResponse listing `devices`, each Unhealthy
    (the longer health word): the most that resource's message can ever be."""
    total = 0
    for dev in devices:
        size = _field_bytes(_LONGEST_HEALTH)
        if dev.id:  # proto3 writes no empty string
            size += _field_bytes(len(dev.id.encode()))
        if dev.numa_node is not None:  # topology { nodes { ID } }; ID 0 is not written
            node = 1 + _varint_bytes(dev.numa_node) if dev.numa_node else 0
            size += _field_bytes(_field_bytes(node))
        total += _field_bytes(size)
    return total


def _check_list_size(name: str, devices: list[AdvertisedDevice]) -> None:
    size = list_and_watch_bytes(devices)
    if size > KUBELET_RECEIVE_LIMIT:
        raise HardwareError(
            f"{name}: {len(devices)} devices make a ListAndWatch message of {size} bytes, over "
            f"the kubelet's 4 MiB gRPC receive limit ({KUBELET_RECEIVE_LIMIT} bytes), so the "
            "kubelet could not read it; advertise fewer replicas"
        )


def serving(
    gpus: Iterable[Gpu], settings: ResourceSettings
) -> dict[str, list[tuple[AdvertisedDevice, ResourceShare]]]:
    """Per resource of the node's MIG strategy, each of its devices (index order) with
    the resource that serves it and how. Raises HardwareError as build_resources."""
    gpus = tuple(gpus)
    base = _base_devices(gpus, settings.mig_strategy)
    placed = place(base, settings.sharing, mig_aliases(gpus)).placed
    return {name: [(d, placed[d.id]) for d in devs] for name, devs in base.items()}


def mig_aliases(gpus: Iterable[Gpu]) -> dict[str, str]:
    """Pre-R470 MIG UUIDs (MIG-GPU-<uuid>/<gi>/<ci>, lowercase) -> the MIG device's UUID."""
    return {f"mig-{g.uuid}/{m.gi}/{m.ci}".lower(): m.uuid for g in gpus for m in g.mig_devices}


def _gpu_device(gpu: Gpu) -> AdvertisedDevice:
    return AdvertisedDevice(
        id=gpu.uuid,
        physical_id=gpu.uuid,
        gpu_uuid=gpu.uuid,
        index=str(gpu.index),
        paths=(gpu.device_path,),
        numa_node=gpu.numa_node,
        memory_mib=gpu.memory_mib,
    )


def _mig_device(gpu: Gpu, mig: MigDevice) -> AdvertisedDevice:
    return AdvertisedDevice(
        id=mig.uuid,
        physical_id=mig.uuid,
        gpu_uuid=gpu.uuid,
        index=f"{gpu.index}:{mig.index}",
        paths=(gpu.device_path, *mig.cap_paths),
        numa_node=gpu.numa_node,
        memory_mib=mig.memory_mib,
    )


def _base_devices(gpus: tuple[Gpu, ...], strategy: str) -> dict[str, list[AdvertisedDevice]]:
    """Every device of each resource, in index order whatever order the backend gave."""
    gpus = tuple(
        replace(g, mig_devices=tuple(sorted(g.mig_devices, key=lambda m: m.index)))
        for g in sorted(gpus, key=lambda g: g.index)
    )
    if strategy == MIG_NONE:
        return {GPU_RESOURCE: [_gpu_device(g) for g in gpus]}
    if strategy == MIG_SINGLE:
        return {GPU_RESOURCE: _single_strategy(gpus)}
    if strategy == MIG_MIXED:
        out: dict[str, list[AdvertisedDevice]] = {GPU_RESOURCE: []}
        for gpu in gpus:
            if not gpu.mig_enabled:
                out[GPU_RESOURCE].append(_gpu_device(gpu))
            for mig in gpu.mig_devices:
                _require_gpu_instance_sized(gpu, mig)
                out.setdefault(mig_resource_name(mig.profile), []).append(_mig_device(gpu, mig))
        return out
    raise HardwareError(f"unknown MIG strategy {strategy!r}: use none, single or mixed")


def _require_gpu_instance_sized(gpu: Gpu, mig: MigDevice) -> None:
    if compute_sliced(mig):
        raise HardwareError(
            f"migStrategy mixed: GPU {gpu.index} ({gpu.uuid}): MIG device {gpu.index}:{mig.index} "
            f"({mig.uuid}) has profile {mig.profile!r}, which matches no resource pattern; only "
            "profiles whose compute slices equal their GPU slices (such as 3g.20gb) are advertised"
        )


def _single_strategy(gpus: tuple[Gpu, ...]) -> list[AdvertisedDevice]:
    enabled = {g.mig_enabled for g in gpus}
    if len(enabled) > 1:
        raise HardwareError(
            "migStrategy single: all devices on the node must be configured with the same "
            "migEnabled value; use migStrategy mixed for a node with MIG and non-MIG GPUs"
        )
    if enabled != {True}:
        return [_gpu_device(g) for g in gpus]
    empty = [str(g.index) for g in gpus if not g.mig_devices]
    if empty:
        raise HardwareError(
            f"migStrategy single: MIG-enabled GPU {', '.join(empty)} has no MIG devices; "
            "create MIG devices or disable MIG on it"
        )
    profiles = sorted({m.profile for g in gpus for m in g.mig_devices})
    if len(profiles) > 1:
        raise HardwareError(
            f"migStrategy single: more than one MIG device type present on node "
            f"({', '.join(profiles)}); use migStrategy mixed"
        )
    return [_mig_device(g, m) for g in gpus for m in g.mig_devices]
