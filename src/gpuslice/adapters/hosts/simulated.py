"""The simulated host: a node file of GPUs (adapters.fake) and its events file, no
device nodes, the testing kit's MPS binary unless another is named."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from gpuslice.adapters.hosts import read_machine_type
from gpuslice.core.errors import ConfigError
from gpuslice.core.ports import GpuBackend, PodCgroups, ProcessOwners, TimeSlicer

SIMULATED_MPS_CONTROL = [sys.executable, "-m", "gpuslice.testing.mps_control"]


@dataclass(frozen=True)
class SimulatedHost:
    node_file: str  # --fake-hardware
    events_file: str | None  # its JSON-lines file of injected events
    mps_control_binary: str
    default_mps_control: str  # the flag's default: replaced by the simulated binary
    default_machine_type_file: str  # the host's DMI name: not the simulated node's
    default_cgroup_root: str  # the host's cgroup tree: not the simulated node's

    def open_backend(self) -> GpuBackend:
        from gpuslice.adapters.fake import FakeBackend

        return FakeBackend.from_spec(self.node_file, self.events_file)

    def imex_present(self) -> frozenset[int]:
        """The IMEX channels the node file lists."""
        from gpuslice.adapters.fake import imex_channels

        try:
            return imex_channels(self.node_file)
        except ConfigError:
            return frozenset()  # opening the backend reports the bad node file

    def control_devices(self) -> tuple[str, ...]:
        return ()

    def extra_cdi_nodes(self) -> Mapping[str, tuple[str, ...]]:
        return {}

    def machine_type(self, path: str) -> str | None:
        """None (the snapshot's own) unless a file other than the default is named."""
        return None if path == self.default_machine_type_file else read_machine_type(path)

    def pod_cgroups(self, root: str) -> PodCgroups:
        """The node file's cgroup facts, unless a tree other than the host's is named
        (one laid out for the simulation, as the demo does)."""
        if root != self.default_cgroup_root:
            from gpuslice.adapters.cgroup_tree import PodCgroupTree

            return PodCgroupTree(root)
        from gpuslice.adapters.fake.cgroups import SimulatedCgroups

        return SimulatedCgroups(self.node_file)

    def process_owners(self) -> ProcessOwners | None:
        """The backend knows its processes' pods (the events file says which) and ends
        them itself: the PIDs it lists are not the host's, so none is ever signalled."""
        return None

    def mps_binary(self) -> list[str]:
        if self.mps_control_binary == self.default_mps_control:
            return list(SIMULATED_MPS_CONTROL)
        return [self.mps_control_binary]

    def time_slicer(self) -> TimeSlicer:
        from gpuslice.adapters.fake.time_slices import FakeTimeSlices

        return FakeTimeSlices(self.events_file or None)
