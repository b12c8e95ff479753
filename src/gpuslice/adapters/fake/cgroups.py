"""The simulated node's cgroups: the facts its node file gives (`cgroup`), never the
tree of the machine the simulation runs on. It models no pod cgroups: a tree laid out
as the kubelet's (the demo makes one) is named with --cgroup-root instead."""

from __future__ import annotations

from gpuslice.adapters.fake.profiles import load_node
from gpuslice.core.isolation import HostFacts, pci_key


class SimulatedCgroups:
    """core.ports.PodCgroups for the simulated node `spec` (a profile or node file)."""

    def __init__(self, spec: str) -> None:
        self._spec = spec

    def where(self) -> str:
        return f"the simulated node {self._spec} (its node file's cgroup facts)"

    def kubepods(self) -> tuple[str, ...]:
        return ()

    def missing(self) -> str:
        return (
            f"the simulated node {self._spec} models no pod cgroups: name a tree laid out "
            "as the kubelet's with --cgroup-root"
        )

    def watched(self) -> tuple[str, ...]:
        return ()

    def pods(self) -> dict[str, str]:
        return {}

    def facts(self, driver: str) -> HostFacts:
        node = load_node(self._spec)
        v2 = node.cgroup.version == 2
        dmem = v2 and node.cgroup.dmem
        devices = frozenset(pci_key(g.pci_bus_id) for g in node.snapshot.gpus) if dmem else None
        return HostFacts(
            cgroup_v2=v2, dmem_controller=dmem, dmem_devices=devices or frozenset(), driver=driver
        )
