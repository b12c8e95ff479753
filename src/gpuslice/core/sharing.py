"""What the config asks for, in core terms: the MIG strategy and replica rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuslice.core import strategies
from gpuslice.core.strategies import Strategy

NONE = strategies.WHOLE.name
TIME_SLICING = strategies.TIME_SLICING.name
MPS = strategies.MPS.name

MIG_NONE = "none"
MIG_SINGLE = "single"
MIG_MIXED = "mixed"

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class ReplicaRule:
    """Advertise `replicas` shares of each selected device of resource `name`."""

    name: str
    replicas: int
    rename: str = ""  # advertise under this name instead ("" keeps `name`)
    # None selects every device; an int the N lowest-index ones not otherwise taken;
    # strings are GPU indexes ("0"), MIG indexes ("0:1") or UUIDs (core.placement).
    devices: int | tuple[str, ...] | None = None
    path: str = field(default="", compare=False)  # where it is in the config, for messages

    @property
    def advertised_name(self) -> str:
        return self.rename or self.name


@dataclass(frozen=True, slots=True)
class SharingPlan:
    strategy: str = NONE  # the name of a sharing strategy (core.strategies)
    rules: tuple[ReplicaRule, ...] = ()
    fail_requests_greater_than_one: bool = False

    @property
    def serving(self) -> Strategy:
        return strategies.by_name(self.strategy)


@dataclass(frozen=True, slots=True)
class ResourceSettings:
    mig_strategy: str = MIG_NONE
    sharing: SharingPlan = field(default_factory=SharingPlan)
