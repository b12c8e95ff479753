"""GPU models a node file can name, with the values NVML reports for them.

Memory sizes are NVML's totals in MiB (nvidia-smi shows the same numbers);
MIG sizes are what NVML reports for a MIG device of that profile, which can
differ slightly from the GPU-instance profile table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuslice.core.devices import MigEngines


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
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)


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
    ),
    "h100-80gb": GpuModel(
        name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        compute_capability=(9, 0),
        multiprocessors=132,
        architecture="Hopper",
        mig_capable=True,
    ),
}
