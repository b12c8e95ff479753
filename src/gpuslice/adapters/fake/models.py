"""GPU models a node file can name, with the values NVML reports for them.

Memory sizes are NVML's totals in MiB (nvidia-smi shows the same numbers);
MIG sizes are what NVML reports for a MIG device of that profile, which can
differ slightly from the GPU-instance profile table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuslice.adapters.fake import mig_tables
from gpuslice.core.devices import MigEngines
from gpuslice.core.mig import MigProfileSpec, split_profile


@dataclass(frozen=True, slots=True)
class MigProfile:
    memory_mib: int
    multiprocessors: int
    engines: MigEngines = field(default_factory=MigEngines)


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    multiprocessors: int
    architecture: str
    brand: str = "NVIDIA"
    mig_capable: bool = False
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)  # MIG devices' sizes
    mig_table: tuple[MigProfileSpec, ...] = ()  # GPU-instance profiles and placements
    pci_device_id: int = 0  # as NVML's pciDeviceId: device << 16 | vendor (0x10DE)


# Engines per profile from the MIG user guide's A100-SXM4-40GB table (A100 has no NVENC).
_A100_40GB_MIG = {
    "1g.5gb": MigProfile(4864, 14, MigEngines(copy=1)),
    "1g.5gb+me": MigProfile(4864, 14, MigEngines(copy=1, decoder=1, jpeg=1, ofa=1)),
    "1g.10gb": MigProfile(9984, 14, MigEngines(copy=1, decoder=1)),
    "2g.10gb": MigProfile(9984, 28, MigEngines(copy=2, decoder=1)),
    "3g.20gb": MigProfile(20096, 42, MigEngines(copy=3, decoder=2)),
    "4g.20gb": MigProfile(20096, 56, MigEngines(copy=4, decoder=2)),
    "7g.40gb": MigProfile(40537, 98, MigEngines(copy=7, decoder=5, jpeg=1, ofa=1)),
}

MODELS: dict[str, GpuModel] = {
    "t4": GpuModel(
        name="Tesla T4",
        memory_mib=15360,
        compute_capability=(7, 5),
        multiprocessors=40,
        architecture="Turing",
    ),
    "a100-40gb": GpuModel(
        name="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        compute_capability=(8, 0),
        multiprocessors=108,
        architecture="Ampere",
        mig_capable=True,
        mig_profiles=_A100_40GB_MIG,
        mig_table=mig_tables.A100_40GB,
        pci_device_id=0x20B010DE,
    ),
    "a100-80gb": GpuModel(
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        compute_capability=(8, 0),
        multiprocessors=108,
        architecture="Ampere",
        mig_capable=True,
        mig_table=mig_tables.A100_80GB,
        pci_device_id=0x20B210DE,
    ),
    "h100-80gb": GpuModel(
        name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        compute_capability=(9, 0),
        multiprocessors=132,
        architecture="Hopper",
        mig_capable=True,
        mig_table=mig_tables.H100_80GB,
        pci_device_id=0x233010DE,
    ),
    "h200": GpuModel(
        name="NVIDIA H200",
        memory_mib=143771,
        compute_capability=(9, 0),
        multiprocessors=132,
        architecture="Hopper",
        mig_capable=True,
        mig_table=mig_tables.H200,
        pci_device_id=0x233510DE,
    ),
}


def model_named(product_name: str) -> GpuModel | None:
    """The model whose NVML product name this is."""
    return next((m for m in MODELS.values() if m.name == product_name), None)


def mig_device_size(model: GpuModel | None, profile: str) -> MigProfile | None:
    """The memory, multiprocessors and engines NVML reports for a MIG device of `profile`
    ("1g.5gb", or "1c.3g.20gb": the compute instance's share) on this model; None when
    the model does not say."""
    if model is None:
        return None
    whole, compute, slices = split_profile(profile)
    known = model.mig_profiles.get(whole)
    if known is None:
        spec = next((s for s in model.mig_table if s.name == whole), None)
        if spec is None:
            return None
        known = MigProfile(spec.memory_mib, spec.multiprocessors, spec.engines)
    return MigProfile(known.memory_mib, known.multiprocessors * compute // slices, known.engines)
