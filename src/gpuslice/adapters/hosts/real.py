"""The real host: NVML under the driver root, the device nodes present here, the pods'
cgroups under the proc root, nvidia-smi's time slices and the MPS binary as given."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpuslice.adapters.hosts import read_machine_type
from gpuslice.core.cdi import EXTRA_NODES
from gpuslice.core.container_spec import CONTROL_DEVICES, IMEX_CHANNELS
from gpuslice.core.ports import GpuBackend, PodCgroups, ProcessOwners, TimeSlicer


@dataclass(frozen=True)
class RealHost:
    driver_root: str  # as mounted in this container ("" : /driver-root for NVML)
    proc_root: str
    mps_control_binary: str

    def open_backend(self) -> GpuBackend:
        """NVML (BackendError when it cannot start)."""
        from gpuslice.adapters.nvml import NvmlBackend

        return NvmlBackend.open(driver_root=self.driver_root or "/driver-root")

    def imex_present(self) -> frozenset[int]:
        """The IMEX channels whose device node exists under / or the driver root."""
        from gpuslice.adapters.imex import existing_channels

        return existing_channels(IMEX_CHANNELS, roots=("/", self.driver_root))

    def control_devices(self) -> tuple[str, ...]:
        return tuple(p for p in CONTROL_DEVICES if os.path.exists(p))

    def extra_cdi_nodes(self) -> Mapping[str, tuple[str, ...]]:
        from gpuslice.adapters.cdi_file import present_nodes

        return {k: present_nodes(v) for k, v in EXTRA_NODES.items()}

    def machine_type(self, path: str) -> str | None:
        return read_machine_type(path)

    def pod_cgroups(self, root: str) -> PodCgroups:
        from gpuslice.adapters.cgroup_tree import PodCgroupTree

        return PodCgroupTree(root)

    def process_owners(self) -> ProcessOwners | None:
        """The pods' cgroups under --proc-root say which pod a PID is in."""
        from gpuslice.adapters.cgroups import CgroupOwners

        return CgroupOwners(self.proc_root)

    def mps_binary(self) -> list[str]:
        return [self.mps_control_binary]

    def time_slicer(self) -> TimeSlicer:
        from gpuslice.adapters.nvml.time_slices import NvidiaSmiTimeSlices

        return NvidiaSmiTimeSlices()
