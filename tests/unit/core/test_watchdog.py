"""The memory-budget rules: who has a budget and how large, who is over it, and when
each policy acts (once per stretch over budget; terminate at every sample while over)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuslice.config.options import parse_budgets
from gpuslice.core.attribution import ContainerUsage
from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.errors import ConfigError
from gpuslice.core.watchdog import Policy, budget_of, budgets, decide

MIB = 1024 * 1024
GIB = 1024 * MIB
UUID = "GPU-a"
NODE = HardwareSnapshot(
    gpus=(Gpu(index=0, minor=0, uuid=UUID, name="T4", memory_mib=16384, compute_capability=(7, 5)),)
)


def usage(used_mib: int, *ids: str, share: float | None = 0.25, res: str = "r") -> ContainerUsage:
    return ContainerUsage(
        gpu_index=0, gpu_uuid=UUID, model_name="T4", namespace="ml", pod="p", container="c",
        resource=res, device_ids=ids or (f"{UUID}::0",), memory_used_bytes=used_mib * MIB,
        memory_peak_bytes=used_mib * MIB, allocated_share=share, used_share=0.0,
        utilisation=None, utilisation_absent="", processes=1, pids=(7,),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("container", "overrides", "budget"),
    [
        (usage(0), {}, 4 * GIB),  # its share of the GPU's memory
        (usage(0, f"{UUID}::0", f"{UUID}::1", share=0.5), {}, 8 * GIB),  # two replicas
        (usage(0), {"r": GIB}, GIB),  # the override, per replica
        (usage(0, f"{UUID}::0", f"{UUID}::1"), {"r": GIB}, 2 * GIB),
        (usage(0), {"other": GIB}, 4 * GIB),  # another resource's override
        (usage(0, UUID, share=1.0), {}, None),  # a whole GPU: nothing shares it
        (usage(0, "MIG-x", share=0.125), {"r": GIB}, None),  # MIG isolates memory itself
        (usage(0, share=None), {}, None),  # share unknown, no override: no guess
        (usage(0, share=None), {"r": GIB}, GIB),
    ],
)
def test_budget_of(
    container: ContainerUsage, overrides: dict[str, int], budget: int | None
) -> None:
    assert budget_of(container, 16 * GIB, overrides) == budget


@pytest.mark.parametrize(
    ("policy", "used_mib", "previously_over", "acts", "held"),
    [
        (Policy.REPORT, 4096, False, False, False),  # at the budget is not over it
        (Policy.REPORT, 4097, False, True, False),
        (Policy.REPORT, 5000, True, False, False),  # once per stretch over budget
        (Policy.UNHEALTHY, 5000, False, True, True),
        (Policy.UNHEALTHY, 5000, True, False, True),  # still held while over
        (Policy.UNHEALTHY, 100, True, False, False),  # back under: released
        (Policy.TERMINATE, 5000, False, True, False),
        (Policy.TERMINATE, 5000, True, True, False),  # still over: kill again
    ],
)
def test_decide(
    policy: Policy, used_mib: int, previously_over: bool, acts: bool, held: bool
) -> None:
    c = usage(used_mib)
    previous = frozenset({c.key}) if previously_over else frozenset()
    decision = decide(policy, budgets(NODE, [c], {}), previous)
    assert bool(decision.act) == acts
    assert decision.held == (frozenset({UUID}) if held else frozenset())
    assert decision.over == (frozenset({c.key}) if used_mib > 4096 else frozenset())


def test_a_container_on_a_gpu_no_longer_in_the_snapshot_has_no_budget() -> None:
    assert budgets(NODE, [replace(usage(9000), gpu_uuid="GPU-gone")], {}) == []


def test_the_message_names_container_gpu_use_and_budget() -> None:
    (breach,) = decide(Policy.REPORT, budgets(NODE, [usage(5000)], {}), frozenset()).act
    assert breach.message == (
        "container c uses 5000 MiB of GPU 0 (GPU-a) through r, over its budget of 4096 MiB"
    )


def test_budgets_flag() -> None:
    assert parse_budgets("nvidia.com/gpu.shared=10Gi, nvidia.com/gpu=2Gi,") == {
        "nvidia.com/gpu.shared": 10 * GIB,
        "nvidia.com/gpu": 2 * GIB,
    }
    for bad in ("nvidia.com/gpu", "=1Gi", "a=lots", "a=1Xi"):
        with pytest.raises(ConfigError, match=r"^--memory-budget \(GPUSLICE_MEMORY_BUDGET\): "):
            parse_budgets(bad)
