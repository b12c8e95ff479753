"""DRA devices: what this node publishes, named and described as NVIDIA's DRA driver does.

A device is one physical GPU or MIG device behind an advertised resource (replicas of
one GPU are one DRA device). Names are DNS labels built from the PCI bus ID (the UUID
where none is known) and, for a MIG device, its profile and GPU/compute instance IDs:
they stay the same across restarts and drains, unlike names built from minor numbers or
indices. Attribute names are NVIDIA's (`type`, `uuid`, `productName`, ...), so CEL
selectors written for its driver port by changing only the domain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpuslice.core.devices import Gpu, HardwareSnapshot, MigDevice
from gpuslice.core.resources import Resource
from gpuslice.core.sharing import MIG_MIXED, NONE, ResourceSettings
from gpuslice.core.strategies import Strategy, by_name, of_device

STANDARD = "resource.kubernetes.io"  # the standard attributes' domain
GPU, MIG = "gpu", "mig"
MAX_ATTRIBUTES = 32  # attributes plus capacities per device
MAX_STRING = 64  # a string attribute's longest value
Json = dict[str, object]


@dataclass(frozen=True, slots=True)
class DraOptions:
    """How the node serves DRA. NVIDIA's driver name by default, so claims and
    DeviceClasses written for its driver work as they are."""

    driver: str = "gpu.nvidia.com"
    # Publish a replicated device once with consumable capacity `shares` (Kubernetes
    # 1.36, DRAConsumableCapacity); otherwise several pods share one claim.
    consumable_shares: bool = False
    # Unhealthy devices carry a NoSchedule taint (1.36, DRADeviceTaints) instead of
    # being withdrawn from the slices.
    taint_unhealthy: bool = False
    # Publish the MIG devices of MIG-enabled GPUs, as NVIDIA's DRA driver does (it has no
    # MIG strategy), whatever the device plugin's migStrategy; False: follow it.
    mig_devices: bool = True
    # Publish every MIG placement of the GPUs DRA partitions as a device consuming the
    # GPU's shared counters, and create the instance in prepare (core.dra.partitions).
    dynamic_mig: bool = False

    @property
    def cdi_kind(self) -> str:
        """The CDI kind of the per-claim specs, as NVIDIA's driver forms it."""
        return f"k8s.{self.driver}/claim"


@dataclass(frozen=True, slots=True)
class DraDevice:
    name: str
    uuid: str  # the GPU or MIG UUID
    gpu_uuid: str  # the physical GPU that holds it
    kind: str  # GPU or MIG
    index: str  # "0" for a GPU, "0:1" for a MIG device (the node's numbering)
    resource: str  # the advertised resource it comes from
    sharing: str  # the name of the node's sharing strategy for it (core.strategies)
    replicas: int
    paths: tuple[str, ...]  # device nodes
    attributes: Mapping[str, Json] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)

    @property
    def serving(self) -> Strategy:
        return by_name(self.sharing)

    @property
    def served_as(self) -> Strategy:
        """How the device itself is served (a MIG slice or whole), beside its sharing."""
        return of_device(self.kind == MIG)

    @property
    def shared(self) -> bool:
        """Several claims may hold it at once (replicas of a sharing strategy)."""
        return self.serving.shares and self.replicas > 1


def driver_name_problem(name: str) -> str:
    """Why `name` cannot be a DRA driver name (a DNS subdomain of at most 63
    characters), or ""."""
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    if len(name) > 63 or not re.fullmatch(rf"{label}(\.{label})*", name):
        return f"{name!r} is not a DNS subdomain of at most 63 lower-case characters"
    return ""


def dra_settings(settings: ResourceSettings, opts: DraOptions) -> ResourceSettings:
    """The resource settings DRA builds its devices from: the node's, with the mixed MIG
    strategy unless `opts.mig_devices` is off (a MIG-enabled GPU is its MIG devices,
    every other GPU itself, as NVIDIA's DRA driver publishes them)."""
    return replace(settings, mig_strategy=MIG_MIXED) if opts.mig_devices else settings


def gpu_name(gpu: Gpu) -> str:
    """gpu-0000-07-00-0 from PCI bus ID 00000000:07:00.0; gpu-<uuid> without one."""
    bus = pci_bus_id(gpu.pci_bus_id)
    if bus:
        return "gpu-" + re.sub(r"[:.]", "-", bus)
    return "gpu-" + _label(gpu.uuid.removeprefix("GPU-"))


def mig_name(gpu: Gpu, mig: MigDevice) -> str:
    """<gpu name>-mig-<profile>-<gi>-<ci>: gpu-0000-07-00-0-mig-1g5gb-9-0."""
    return f"{gpu_name(gpu)}-mig-{_label(mig.profile)}-{mig.gi}-{mig.ci}"


def pci_bus_id(nvml: str) -> str:
    """The standard attribute's form, 0000:07:00.0, of NVML's 00000000:07:00.0; "" when
    it does not parse."""
    found = re.fullmatch(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", nvml)
    if not found:
        return ""
    domain, bus, dev, fn = found.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def semver(text: str) -> str:
    """A version attribute from a driver version: 550.54.15, 535.104.5 (no leading
    zeros), 560.28.0 from 560.28; "" when it is not numeric."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return ""
    return ".".join(str(int(p)) for p in (*parts, "0", "0")[:3])


def build_devices(
    snapshot: HardwareSnapshot,
    resources: Iterable[Resource],
) -> tuple[DraDevice, ...]:
    """One device per GPU or MIG device behind `resources`, sorted by name."""
    gpus = {g.uuid: g for g in snapshot.gpus}
    out: dict[str, DraDevice] = {}
    for res in resources:
        sharing = res.sharing if res.replicated else NONE
        for adv in res.devices:
            gpu = gpus.get(adv.gpu_uuid)
            if gpu is None or adv.physical_id in out:
                continue
            common = _common(snapshot, gpu)
            if adv.is_mig:
                mig = next((m for m in gpu.mig_devices if m.uuid == adv.physical_id), None)
                if mig is None:
                    continue
                name, attrs, cap = mig_name(gpu, mig), _mig_attributes(gpu, mig), _mig_cap(mig)
            else:
                name, attrs, cap = gpu_name(gpu), _gpu_attributes(gpu), _gpu_cap(gpu)
            out[adv.physical_id] = DraDevice(
                name=name,
                uuid=adv.physical_id,
                gpu_uuid=gpu.uuid,
                kind=MIG if adv.is_mig else GPU,
                index=adv.index,
                resource=res.name,
                sharing=sharing,
                replicas=adv.replicas,
                paths=adv.paths,
                attributes={**attrs, "sharing": _string(sharing), **common},
                capacity=cap,
            )
    return tuple(sorted(out.values(), key=lambda d: d.name))


def _common(snapshot: HardwareSnapshot, gpu: Gpu) -> dict[str, Json]:
    attrs: dict[str, Json] = {
        "productName": _string(gpu.name),
        "brand": _string(gpu.brand),
        "architecture": _string(gpu.architecture),
        "cudaComputeCapability": {"version": "{}.{}.0".format(*gpu.compute_capability)},
    }
    driver = semver(snapshot.driver_version)
    if driver:
        attrs["driverVersion"] = {"version": driver}
    if snapshot.cuda_driver_version:
        major, minor = divmod(snapshot.cuda_driver_version, 1000)
        attrs["cudaDriverVersion"] = {"version": f"{major}.{minor // 10}.0"}
    if gpu.pcie_root:
        attrs[f"{STANDARD}/pcieRoot"] = _string(gpu.pcie_root)
    if gpu.numa_node is not None:
        attrs[f"{STANDARD}/numaNode"] = {"int": gpu.numa_node}
    return {k: v for k, v in attrs.items() if v != {"string": ""}}


def _gpu_attributes(gpu: Gpu) -> dict[str, Json]:
    attrs: dict[str, Json] = {"type": _string(GPU), "uuid": _string(gpu.uuid)}
    bus = pci_bus_id(gpu.pci_bus_id)
    if bus:
        attrs[f"{STANDARD}/pciBusID"] = _string(bus)
    return attrs


def _mig_attributes(gpu: Gpu, mig: MigDevice) -> dict[str, Json]:
    return {
        "type": _string(MIG),
        "uuid": _string(mig.uuid),
        "parentUUID": _string(gpu.uuid),
        "profile": _string(mig.profile),
    }


def _gpu_cap(gpu: Gpu) -> dict[str, str]:
    cap = {"memory": f"{gpu.memory_mib}Mi"}
    if gpu.multiprocessors:
        cap["multiprocessors"] = str(gpu.multiprocessors)
    return cap


def _mig_cap(mig: MigDevice) -> dict[str, str]:
    e = mig.engines
    counts = {
        "multiprocessors": mig.multiprocessors,
        "copyEngines": e.copy,
        "decoders": e.decoder,
        "encoders": e.encoder,
        "jpegEngines": e.jpeg,
        "ofaEngines": e.ofa,
    }
    return {"memory": f"{mig.memory_mib}Mi", **{k: str(v) for k, v in counts.items() if v}}


def _string(value: str) -> Json:
    return {"string": value[:MAX_STRING]}


def _label(text: str) -> str:
    """Lower-case letters, digits and dashes only: 1g.5gb+me -> 1g5gbme."""
    return re.sub(r"[^a-z0-9-]", "", text.lower()).strip("-") or "x"


# For partitionable MIG devices (core.dra.partitions): the whole GPU, and a placement's
# attributes, described as the devices above are.


def whole_gpu(snapshot: HardwareSnapshot, gpu: Gpu) -> DraDevice:
    """The whole GPU, unshared, as build_devices describes it."""
    return DraDevice(
        name=gpu_name(gpu),
        uuid=gpu.uuid,
        gpu_uuid=gpu.uuid,
        kind=GPU,
        index=str(gpu.index),
        resource="",
        sharing=NONE,
        replicas=1,
        paths=(gpu.device_path,),
        attributes={**_gpu_attributes(gpu), **_common(snapshot, gpu)},
        capacity=_gpu_cap(gpu),
    )


def partition_attributes(snapshot: HardwareSnapshot, gpu: Gpu, profile: str) -> dict[str, Json]:
    """A MIG placement's: `type: mig`, `profile`, `parentUUID` and its parent's common ones
    (no `uuid`: the instance does not exist yet)."""
    own = {"type": _string(MIG), "parentUUID": _string(gpu.uuid), "profile": _string(profile)}
    return {**own, **_common(snapshot, gpu)}


def name_label(text: str) -> str:
    """`text` as part of a device name: 1g.5gb+me -> 1g5gbme."""
    return _label(text)
