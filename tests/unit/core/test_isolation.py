"""Which nodes can enforce per-pod GPU memory limits, and what limit each pod gets."""

from __future__ import annotations

import pytest

from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.errors import ConfigError
from gpuslice.core.isolation import (
    DMEM,
    DRIVER,
    MPS_PINNED,
    NONE,
    HostFacts,
    Limit,
    LimitRule,
    MemoryPolicy,
    check_policy,
    detect,
    driver_problem,
    limited_gpus,
    missing_line,
    node_mode,
    pci_key,
    pod_limits,
)
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import ReplicaRule, ResourceSettings, SharingPlan
from gpuslice.core.usage import CheckpointEntry

MIB = 1 << 20
PCI = "00000000:3B:00.0"


def gpu(index: int = 0, *, mig: bool = False) -> Gpu:
    return Gpu(index, f"GPU-{index}", "Tesla T4", index, 16384, (7, 5), PCI, mig_enabled=mig)


def snap(*gpus: Gpu) -> HardwareSnapshot:
    return HardwareSnapshot(gpus or (gpu(),), driver_version="615.10")


FULL = HostFacts(True, True, frozenset({"0000:3b:00.0"}), driver="")


def test_the_kernel_enforces_where_dmem_lists_the_gpu() -> None:
    (got,) = detect(snap(), FULL)
    assert (got.mode, got.missing) == (DMEM, "")


def test_without_the_dmem_controller_the_driver_enforces_and_says_so() -> None:
    (got,) = detect(snap(), HostFacts(True, False, frozenset(), driver=""))
    assert got.mode == DRIVER
    assert "kernel before 6.14" in got.missing


@pytest.mark.parametrize(
    ("facts", "mig", "mps", "mode", "said"),
    [
        (
            HostFacts(True, True, frozenset(), driver="driver 550.54 is older than r615"),
            False,
            False,
            NONE,
            "older than r615",
        ),
        (HostFacts(False, False, frozenset(), driver=""), False, False, NONE, "cgroup v2"),
        (FULL, True, False, NONE, "MIG is enabled"),
        (HostFacts(False, False, frozenset(), driver=""), False, True, MPS_PINNED, "cgroup v2"),
    ],
)
def test_what_is_missing_is_said_in_one_line(
    facts: HostFacts, mig: bool, mps: bool, mode: str, said: str
) -> None:
    g = gpu(mig=mig)
    got = detect(snap(g), facts, frozenset({g.uuid}) if mps else frozenset())
    assert got[0].mode == mode
    assert said in missing_line(got)
    assert "\n" not in missing_line(got)


def test_driver_problem_names_the_version_or_the_missing_call() -> None:
    assert driver_problem("580.65.06", True) == "driver 580.65.06 is older than r615"
    assert "lacks" in driver_problem("615.10", False)
    assert driver_problem("615.10", True) == ""


def test_the_node_label_is_the_weakest_gpu_mode() -> None:
    modes = detect(snap(gpu(0), gpu(1, mig=True)), FULL)
    assert node_mode(modes) == NONE
    assert pci_key(PCI) == pci_key("0000:3b:00.0")


def test_limits_need_the_policy_on_an_enforcing_mode_and_the_pods_cgroups() -> None:
    modes = detect(snap(gpu(0), gpu(1, mig=True)), FULL)
    on = MemoryPolicy.of(True)
    assert limited_gpus(modes, on) == {"GPU-0"}
    assert limited_gpus(modes, MemoryPolicy.of(False)) == frozenset()
    assert limited_gpus(modes, on, "no kubepods cgroup under /sys/fs/cgroup") == frozenset()


def resources(replicas: int = 4) -> tuple:  # type: ignore[type-arg]
    plan = SharingPlan("time-slicing", (ReplicaRule("nvidia.com/gpu", replicas),))
    return build_resources(snap(gpu(0), gpu(1)), ResourceSettings(sharing=plan))


def entry(uid: str, *ids: str) -> CheckpointEntry:
    return CheckpointEntry(uid, "main", "nvidia.com/gpu", ids)


def test_a_pod_gets_its_replicas_share_of_each_gpu_summed() -> None:
    got = pod_limits(
        resources(), [entry("p", "GPU-0::0", "GPU-0::1", "GPU-1::0")], MemoryPolicy.of(True)
    )
    assert got == {"GPU-0": Limit(2 * 4096 * MIB), "GPU-1": Limit(4096 * MIB)}


def test_an_override_and_off() -> None:
    rule = {"nvidia.com/gpu": LimitRule(hard=1 << 30, soft=1 << 29)}
    got = pod_limits(resources(), [entry("p", "GPU-0::0")], MemoryPolicy.of(True, rule))
    assert got == {"GPU-0": Limit(1 << 30, 1 << 29)}
    off = MemoryPolicy.of(True, {"nvidia.com/gpu": LimitRule(off=True)})
    assert pod_limits(resources(), [entry("p", "GPU-0::0")], off) == {}


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        (LimitRule(hard=17 << 30), "more than GPU 0 has"),
        (LimitRule(hard=8 << 30), "allowOvercommit"),
        (LimitRule(hard=1 << 30, soft=2 << 30), "over the hard limit"),
    ],
)
def test_bad_limits_are_refused_in_one_line(rule: LimitRule, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        check_policy(resources(), MemoryPolicy.of(True, {"nvidia.com/gpu": rule}))
    assert "\n" not in str(caught.value)
    check_policy(resources(), MemoryPolicy.of(True, {"nvidia.com/gpu": LimitRule(hard=4 << 30)}))
