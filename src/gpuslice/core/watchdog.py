"""The memory-budget watchdog's rules: what each time-sliced replica may use, who is
over it, and what to do about it.

A container holding replicas of a GPU gets a budget: its allocated share of the GPU's
memory, or the per-resource override. Whole GPUs and MIG devices get none (nothing
shares a whole GPU; MIG isolates memory in hardware). A container is acted on when it
goes over; under `report` and `unhealthy` once per stretch over budget, under
`terminate` at every sample while still over (the kill is what should end it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpuslice.core.attribution import MIB, ContainerUsage
from gpuslice.core.devices import HardwareSnapshot, is_replica

Key = tuple[str, str, str, str, str]  # ContainerUsage.key


class Policy(StrEnum):
    REPORT = "report"  # a metric and an Event on the Pod
    UNHEALTHY = "unhealthy"  # and every replica of its GPU Unhealthy while it stays over
    TERMINATE = "terminate"  # and SIGKILL its largest process


class NotProvenError(Exception):
    """The process to kill cannot be proven to be in the container over budget."""


POLICIES = tuple(p.value for p in Policy)


@dataclass(frozen=True, slots=True)
class Breach:
    """A container over its budget on one GPU."""

    usage: ContainerUsage
    budget_bytes: int

    @property
    def message(self) -> str:
        u = self.usage
        return (
            f"container {u.container} uses {u.memory_used_bytes // MIB} MiB of GPU {u.gpu_index} "
            f"({u.gpu_uuid}) through {u.resource}, over its budget of "
            f"{self.budget_bytes // MIB} MiB"
        )


@dataclass(frozen=True, slots=True)
class Decision:
    act: tuple[Breach, ...]  # act on these now
    over: frozenset[Key]  # every container over budget now (the next call's `previous`)
    held: frozenset[str]  # GPU UUIDs to hold Unhealthy (policy unhealthy)


def budget_of(
    usage: ContainerUsage, gpu_memory_bytes: int, overrides: Mapping[str, int]
) -> int | None:
    """The container's budget on this GPU; None: it holds no replica there, or its
    share is unknown (the kubelet no longer lists the replica) and nothing overrides it."""
    if not any(is_replica(i) for i in usage.device_ids):
        return None
    override = overrides.get(usage.resource)
    if override is not None:
        return override * len(usage.device_ids)
    if usage.allocated_share is None:
        return None
    return int(usage.allocated_share * gpu_memory_bytes)


def budgets(
    snapshot: HardwareSnapshot, containers: Iterable[ContainerUsage], overrides: Mapping[str, int]
) -> list[tuple[ContainerUsage, int]]:
    out = []
    for c in containers:
        gpu = snapshot.gpu_by_uuid(c.gpu_uuid)
        if gpu is None:
            continue
        budget = budget_of(c, gpu.memory_mib * MIB, overrides)
        if budget is not None:
            out.append((c, budget))
    return out


def decide(
    policy: Policy, budgeted: Iterable[tuple[ContainerUsage, int]], previous: frozenset[Key]
) -> Decision:
    breaches = [Breach(c, b) for c, b in budgeted if c.memory_used_bytes > b]
    over = frozenset(b.usage.key for b in breaches)
    act = tuple(b for b in breaches if policy is Policy.TERMINATE or b.usage.key not in previous)
    held = (
        frozenset(b.usage.gpu_uuid for b in breaches) if policy is Policy.UNHEALTHY else frozenset()
    )
    return Decision(act, over, held)
