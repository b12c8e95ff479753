"""Per-pod GPU memory limits (driver r615 per-cgroup limits): what a node can enforce,
and what limit each pod's shares give it on each GPU.

Detection is a pure rule over facts the adapters read (the driver's version and calls,
the cgroup version and the kernel's dmem controller, MIG). The policy gives every
replica of a replicated resource a hard limit of its GPU's memory divided by its
replicas, unless the config overrides it per resource or turns it off; a pod's limit on
a GPU is the sum over the replicas it holds there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.errors import ConfigError
from gpuslice.core.resources import AdvertisedDevice, Resource
from gpuslice.core.usage import CheckpointEntry

MIB = 1 << 20
UNLIMITED = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX: no hard limit
MIN_DRIVER_MAJOR = 615
LABEL = "nvidia.com/gpu.memory-isolation"

# How limits are enforced on a GPU, strongest first.
DMEM = "dmem"  # the driver's per-cgroup limits, enforced by the kernel's dmem controller
DRIVER = "driver"  # the driver's per-cgroup limits, enforced by the driver's own backend
MPS_PINNED = "mps-pinned"  # only MPS clients' pinned memory limits
NONE = "none"
MODES = (DMEM, DRIVER, MPS_PINNED, NONE)
ENFORCING = frozenset({DMEM, DRIVER})


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What the cgroup adapter and the backend read about the node."""

    cgroup_v2: bool = False
    dmem_controller: bool = False  # "dmem" in the root's cgroup.controllers
    dmem_devices: frozenset[str] = frozenset()  # PCI bus IDs of dmem.capacity's nvidia lines
    driver: str = "no GPU backend"  # why the driver cannot set limits; "" when it can


@dataclass(frozen=True, slots=True)
class GpuIsolation:
    """One GPU's answer: its mode and, when weaker than dmem, what is missing."""

    index: int
    uuid: str
    mode: str
    missing: str = ""


def driver_problem(version: str, has_calls: bool) -> str:
    """Why a driver cannot set per-cgroup limits ("" when it can)."""
    head = version.split(".", 1)[0]
    if not head.isdigit() or int(head) < MIN_DRIVER_MAJOR:
        return f"driver {version or 'unknown'} is older than r{MIN_DRIVER_MAJOR}"
    if not has_calls:
        return "the NVML library lacks nvmlDeviceSetMemoryLimits_v1"
    return ""


def detect(
    snapshot: HardwareSnapshot, facts: HostFacts, mps_gpus: frozenset[str] = frozenset()
) -> tuple[GpuIsolation, ...]:
    """Each GPU's mode; `mps_gpus` serve an MPS resource (pinned limits at least)."""
    return tuple(_gpu_mode(g, facts, mps_gpus) for g in snapshot.gpus)


def _gpu_mode(gpu: Gpu, facts: HostFacts, mps_gpus: frozenset[str]) -> GpuIsolation:
    missing = [facts.driver] if facts.driver else []
    if not facts.cgroup_v2:
        missing.append("cgroup v2 is not mounted (cgroup v1 or none)")
    if gpu.mig_enabled:
        missing.append("MIG is enabled (the driver does not limit MIG devices)")
    if missing:
        fallback = MPS_PINNED if gpu.uuid in mps_gpus and not gpu.mig_enabled else NONE
        return GpuIsolation(gpu.index, gpu.uuid, fallback, "; ".join(missing))
    if facts.dmem_controller and pci_key(gpu.pci_bus_id) in facts.dmem_devices:
        return GpuIsolation(gpu.index, gpu.uuid, DMEM)
    why = (
        "the kernel's dmem controller does not list this GPU"
        if facts.dmem_controller
        else "no dmem cgroup controller (kernel before 6.14): the driver's own backend enforces"
    )
    return GpuIsolation(gpu.index, gpu.uuid, DRIVER, why)


def mps_gpus(resources: Iterable[Resource]) -> frozenset[str]:
    """GPUs serving a replicated MPS resource: detect()'s `mps_gpus`."""
    return frozenset(
        d.gpu_uuid for r in resources if r.serving.pinned_memory and r.replicated for d in r.devices
    )


def pci_key(bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" and sysfs's "0000:3b:00.0" as one key."""
    parts = bus_id.lower().split(":")
    if len(parts) == 3 and parts[0] and all(c in "0123456789abcdef" for c in parts[0]):
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    return bus_id.lower()


def node_mode(gpus: Sequence[GpuIsolation]) -> str:
    """The node's label value: the mode every GPU shares, else the weakest one's."""
    if not gpus:
        return NONE
    return max((g.mode for g in gpus), key=MODES.index)


def labels(gpus: Sequence[GpuIsolation]) -> dict[str, str]:
    """The node label the agent publishes beside GFD's once the GPUs' modes are known."""
    return {LABEL: node_mode(gpus)} if gpus else {}


def missing_line(gpus: Sequence[GpuIsolation]) -> str:
    """One line naming what keeps the node from dmem enforcement ("" when nothing)."""
    seen: list[str] = []
    for g in gpus:
        for part in g.missing.split("; "):
            if part and part not in seen:
                seen.append(part)
    return "; ".join(seen)


# --- policy -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limit:
    """Bytes; soft 0 means none. A pod's limit on one GPU."""

    hard: int
    soft: int = 0

    def __add__(self, other: Limit) -> Limit:
        return Limit(self.hard + other.hard, self.soft + other.soft)


@dataclass(frozen=True, slots=True)
class LimitReading:
    """A cgroup's limits on one GPU as the driver reads them back, with what it uses."""

    soft: int
    hard: int  # UNLIMITED: none
    used: int  # currentUsed: bytes its processes hold on the GPU

    @property
    def limited(self) -> bool:
        return self.hard != UNLIMITED


@dataclass(frozen=True, slots=True)
class LimitRule:
    """A per-resource override (the config's memoryIsolation.resources entry)."""

    hard: int | None = None  # per replica; None: the GPU's memory / replicas
    soft: int = 0
    off: bool = False


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    enabled: bool = False  # --memory-isolation: the node enforces where it can
    rules: tuple[tuple[str, LimitRule], ...] = ()  # (resource, override), hashable
    allow_overcommit: bool = False

    @classmethod
    def of(
        cls,
        enabled: bool,
        rules: Mapping[str, LimitRule] | None = None,
        *,
        overcommit: bool = False,
    ) -> MemoryPolicy:
        return cls(enabled, tuple(sorted((rules or {}).items())), overcommit)

    def rule(self, resource: str) -> LimitRule | None:
        return next((r for name, r in self.rules if name == resource), None)


def device_limit(device: AdvertisedDevice, resource: str, policy: MemoryPolicy) -> Limit | None:
    """The limit one device of `resource` carries; None: unlimited (a whole GPU, MIG,
    or turned off)."""
    rule = policy.rule(resource) or LimitRule()
    if (
        rule.off
        or not device.served_as.memory_limits
        or (device.replicas < 2 and rule.hard is None)
    ):
        return None
    hard = device.memory_mib * MIB // device.replicas if rule.hard is None else rule.hard
    return Limit(hard, min(rule.soft, hard))


def limited_gpus(
    gpus: Iterable[GpuIsolation], policy: MemoryPolicy, pods_missing: str = ""
) -> frozenset[str]:
    """GPUs whose pods get limits: the policy on, the GPU's mode enforcing, and the pods'
    cgroups found (`pods_missing` says why not)."""
    if not policy.enabled or pods_missing:
        return frozenset()
    return frozenset(g.uuid for g in gpus if g.mode in ENFORCING)


def check_policy(resources: Sequence[Resource], policy: MemoryPolicy) -> None:
    """Refuse, in one ConfigError line, limits the served resources cannot carry: on a
    MIG resource, more than a GPU has, a soft limit over the hard one, or hard limits
    adding up to more than a GPU unless allowOvercommit says so."""
    by_name = {r.name: r for r in resources}
    for name, rule in policy.rules:
        where = f"memoryIsolation.resources[{name}]"
        res = by_name.get(name)
        if rule.off or res is None:
            continue
        if not all(d.served_as.memory_limits for d in res.devices):
            raise ConfigError(f"{where}: {name} is a MIG resource; the driver limits no MIG device")
        for d in res.devices:
            total = d.memory_mib * MIB
            hard = rule.hard if rule.hard is not None else total // d.replicas
            if hard > total:
                raise ConfigError(
                    f"{where}: hardLimit {rule.hard} bytes is more than GPU {d.index} has "
                    f"({d.memory_mib} MiB)"
                )
            if rule.soft > hard:
                raise ConfigError(f"{where}: softLimit {rule.soft} is over the hard limit {hard}")
            if hard * d.replicas > total and not policy.allow_overcommit:
                raise ConfigError(
                    f"{where}: {d.replicas} replicas x {hard // MIB} MiB is more than GPU "
                    f"{d.index}'s {d.memory_mib} MiB; set memoryIsolation.allowOvercommit: true "
                    "to allow it"
                )


def pod_limits(
    resources: Sequence[Resource], entries: Iterable[CheckpointEntry], policy: MemoryPolicy
) -> dict[str, Limit]:
    """GPU UUID -> the pod's limit there: the sum of its devices' limits. `entries` are
    the pod's allocations (the kubelet's checkpoint)."""
    by_name = {r.name: r for r in resources}
    out: dict[str, Limit] = {}
    seen: set[tuple[str, str]] = set()  # an init container's devices go on to the app's
    for entry in entries:
        res = by_name.get(entry.resource)
        if res is None:
            continue
        for device_id in entry.device_ids:
            device = res.device(device_id)
            if device is None or (entry.resource, device_id) in seen:
                continue
            seen.add((entry.resource, device_id))
            limit = device_limit(device, entry.resource, policy)
            if limit is not None:
                held = out.get(device.gpu_uuid)
                out[device.gpu_uuid] = limit if held is None else held + limit
    return out


@dataclass(frozen=True, slots=True)
class PodLimit:
    pod_uid: str
    gpu_uuid: str
    limit: Limit


@dataclass(frozen=True, slots=True)
class IsolationView:
    """What /metrics shows: each GPU's mode (with its model) and the limits in force."""

    gpus: tuple[tuple[GpuIsolation, str], ...] = ()
    limits: tuple[PodLimit, ...] = ()
