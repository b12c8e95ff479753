"""Value types for what the hardware backend saw on a node."""

from __future__ import annotations

from dataclasses import dataclass, field

REPLICA_SEPARATOR = "::"


@dataclass(frozen=True, slots=True)
class MigEngines:
    """Media and copy engines of a MIG device (NVML's shared*Count attributes)."""

    copy: int = 0
    decoder: int = 0
    encoder: int = 0
    jpeg: int = 0
    ofa: int = 0


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a GPU instance with its compute instance)."""

    uuid: str
    index: int  # position among the parent's MIG devices
    profile: str  # as NVML names it: "1g.5gb", "1g.10gb+me"
    gi: int  # GPU instance id
    ci: int  # compute instance id
    memory_mib: int
    multiprocessors: int = 0
    cap_paths: tuple[str, ...] = ()  # /dev/nvidia-caps/nvidia-capN for GI and CI access
    gi_slices: int = 0  # GPU slices of its GPU instance (3 for 3g.20gb); 0 = not reported
    ci_slices: int = 0  # compute slices of its compute instance; 0 = not reported
    engines: MigEngines = MigEngines()


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_mib: int


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU."""

    index: int
    uuid: str
    name: str  # NVML product name, e.g. "NVIDIA A100-SXM4-40GB"
    minor: int
    memory_mib: int
    compute_capability: tuple[int, int]
    pci_bus_id: str = ""
    numa_node: int | None = None
    pcie_root: str = ""  # the PCIe root complex above it, as sysfs names it ("pci0000:00")
    brand: str = ""
    architecture: str = ""
    # PCI class code as sysfs shows it: 0x030200 (3D controller) for a GPU in compute
    # mode, 0x030000 (VGA) for one that drives displays.
    pci_class: int = 0x030200
    # PCI IDs as NVML gives them (device << 16 | vendor: 0x20B010DE), what a mig-parted
    # device-filter names; 0 where unknown.
    pci_device_id: int = 0
    pci_subsystem_id: int = 0
    multiprocessors: int = 0
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    # Peer GPU UUID -> number of NVLink links to it.
    nvlinks: tuple[tuple[str, int], ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    # Why some facts could not be read ("" when all were): the backend reports
    # such a GPU lost, and only a later full read lets it recover.
    read_error: str = ""

    @property
    def device_path(self) -> str:
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True, slots=True)
class HardwareSnapshot:
    """Everything the backend reported at one moment."""

    gpus: tuple[Gpu, ...]
    driver_version: str = ""
    nvml_version: str = ""
    cuda_driver_version: int = 0  # as NVML reports it, e.g. 12040 for 12.4
    machine: str = ""
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """Something the backend observed about one physical GPU.

    kind is "xid" (with the XID code), "lost" (fell off the bus / unreachable)
    or "recovered" (answering normally again).
    """

    gpu_uuid: str
    kind: str
    xid: int = 0
    detail: str = ""


def replica_id(physical_id: str, n: int) -> str:
    """The annotated ID of replica n of a device: "<uuid>::<n>"."""
    return f"{physical_id}{REPLICA_SEPARATOR}{n}"


def physical_id(device_id: str) -> str:
    """Strip a replica annotation: "GPU-x::3" -> "GPU-x"; other IDs unchanged."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def is_replica(device_id: str) -> bool:
    return REPLICA_SEPARATOR in device_id
