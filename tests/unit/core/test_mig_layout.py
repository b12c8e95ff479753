"""The MIG layout planner: wanted layouts, the diff, held GPUs, placements and steps."""

from __future__ import annotations

import pytest

from gpuslice.adapters.fake.mig_tables import A100_40GB, H100_80GB
from gpuslice.core.devices import Gpu
from gpuslice.core.errors import ConfigError
from gpuslice.core.mig import DeviceFilter, GpuInstance, MigConfigEntry, Placement
from gpuslice.core.mig_layout import (
    Create,
    Destroy,
    GpuPlan,
    MigGpu,
    SetMode,
    Wanted,
    plan_layout,
    wanted_layout,
)

A100_ID, H100_ID = 0x20B010DE, 0x233010DE


def gpu(index: int = 0, *, hopper: bool = False, mig: bool = False, capable: bool = True) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA H100 80GB HBM3" if hopper else "NVIDIA A100-SXM4-40GB",
        minor=index,
        memory_mib=40960,
        compute_capability=(9, 0) if hopper else (8, 0),
        architecture="Hopper" if hopper else "Ampere",
        pci_device_id=H100_ID if hopper else A100_ID,
        mig_capable=capable,
        mig_enabled=mig,
    )


def node(g: Gpu, *instances: GpuInstance, **holders: tuple[str, ...]) -> MigGpu:
    table = H100_80GB if g.architecture == "Hopper" else A100_40GB
    return MigGpu(g, table if g.mig_capable else (), instances, holders)


def at(profile: str, start: int, size: int, gi: int, uuid: str = "") -> GpuInstance:
    return GpuInstance(profile, Placement(start, size), gi, 0, uuid or f"MIG-{gi}")


def enabled(*devices: tuple[str, int], devices_: tuple[int, ...] | None = None) -> MigConfigEntry:
    return MigConfigEntry(devices_, True, devices)


def plan_one(entries: list[MigConfigEntry], target: MigGpu) -> GpuPlan:
    (plan,) = plan_layout(entries, [target])
    return plan


def creates(plan: GpuPlan) -> list[tuple[str, int]]:
    return [(s.profile, s.placement.start) for s in plan.steps if isinstance(s, Create)]


def test_the_last_matching_entry_wins_and_filters_and_indexes_choose_gpus() -> None:
    entries = [
        MigConfigEntry(None, False),
        enabled(("1g.5gb", 7), devices_=(1,)),
        MigConfigEntry(None, True, (("7g.80gb", 1),), (DeviceFilter(H100_ID),)),
    ]
    assert wanted_layout(entries, gpu(0)) == Wanted(False)
    assert wanted_layout(entries, gpu(1)) == Wanted(True, ("1g.5gb",) * 7)
    assert wanted_layout(entries, gpu(2, hopper=True)) == Wanted(True, ("7g.80gb",))
    other_part = MigConfigEntry(None, True, (), (DeviceFilter(A100_ID, 0x134F10DE),))
    assert wanted_layout([other_part], gpu(0)) is None  # its subsystem ID is not that one


def test_a_gpu_without_mig_is_skipped_by_all_and_refused_by_its_index() -> None:
    t4 = gpu(0, capable=False)
    assert wanted_layout([enabled(("1g.5gb", 1))], t4) is None
    with pytest.raises(ConfigError, match=r"GPU 0 \(.*\): MIG is asked for, but the GPU cannot"):
        wanted_layout([enabled(("1g.5gb", 1), devices_=(0,))], t4)


def test_a_gpu_no_entry_names_or_already_as_wanted_is_left_alone() -> None:
    layout = [at("3g.20gb", 4, 4, 2), at("2g.10gb", 0, 2, 3), at("1g.5gb", 2, 1, 9)]
    entries = [enabled(("1g.5gb", 1), ("2g.10gb", 1), ("3g.20gb", 1), devices_=(0,))]
    untouched = plan_layout(entries, [node(gpu(0, mig=True), *layout), node(gpu(1))])
    assert untouched == (
        GpuPlan(0, "GPU-0", Wanted(True, ("1g.5gb", "2g.10gb", "3g.20gb"))),
        GpuPlan(1, "GPU-1", None),
    )
    assert plan_one([MigConfigEntry(None, False)], node(gpu(0))).steps == ()


def test_balanced_and_4g_plus_3g_layouts_place_largest_first_at_the_lowest_start_that_fits() -> (
    None
):
    balanced = enabled(("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1))
    plan = plan_one([balanced], node(gpu(0)))
    assert plan.steps[0] == SetMode(True, resets=True)  # Ampere: the mode change resets it
    assert creates(plan) == [("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3)]
    plan = plan_one([enabled(("3g.40gb", 1), ("4g.40gb", 1))], node(gpu(0, hopper=True)))
    assert plan.steps[0] == SetMode(True, resets=False)  # Hopper toggles without a reset
    assert creates(plan) == [("4g.40gb", 0), ("3g.40gb", 4)]


def test_a_change_destroys_what_is_not_wanted_keeps_the_rest_and_then_creates() -> None:
    now = [at("3g.20gb", 4, 4, 2), at("2g.10gb", 0, 2, 3), at("1g.5gb", 2, 1, 9)]
    plan = plan_one([enabled(("3g.20gb", 2))], node(gpu(0, mig=True), *now))
    assert plan.steps == (
        Destroy(3, "2g.10gb", Placement(0, 2)),
        Destroy(9, "1g.5gb", Placement(2, 1)),
        Create("3g.20gb", Placement(0, 4)),
    )


def test_what_is_kept_in_the_way_is_destroyed_too() -> None:
    # A 1g at 0 leaves no room for a 4g (only ever at 0): everything is placed again.
    plan = plan_one(
        [enabled(("4g.20gb", 1), ("1g.5gb", 1))], node(gpu(0, mig=True), at("1g.5gb", 0, 1, 7))
    )
    assert plan.steps == (
        Destroy(7, "1g.5gb", Placement(0, 1)),
        Create("4g.20gb", Placement(0, 4)),
        Create("1g.5gb", Placement(4, 1)),
    )


def test_turning_mig_off_destroys_every_instance_first() -> None:
    now = [at("7g.40gb", 0, 8, 0)]
    plan = plan_one([MigConfigEntry(None, False)], node(gpu(0, mig=True), *now))
    assert plan.steps == (Destroy(0, "7g.40gb", Placement(0, 8)), SetMode(False, resets=True))


def test_a_gpu_instance_without_its_compute_instance_is_replaced() -> None:
    torn = GpuInstance("7g.40gb", Placement(0, 8), 0, -1, "")
    plan = plan_one([enabled(("7g.40gb", 1))], node(gpu(0, mig=True), torn))
    assert plan.steps == (
        Destroy(0, "7g.40gb", Placement(0, 8)),
        Create("7g.40gb", Placement(0, 8)),
    )


def test_a_compute_instance_profile_gets_its_gpu_instance_profiles_placements() -> None:
    plan = plan_one([enabled(("1c.3g.20gb", 2))], node(gpu(0, mig=True)))
    assert creates(plan) == [("1c.3g.20gb", 0), ("1c.3g.20gb", 4)]


def test_a_gpu_that_must_change_while_a_device_is_in_use_is_held_naming_what_holds_it() -> None:
    now = [at("7g.40gb", 0, 8, 0, "MIG-a")]
    held = node(gpu(0, mig=True), *now, **{"MIG-a": ("pod ml/train-0",)})
    plan = plan_one([enabled(("1g.5gb", 7))], held)
    assert plan.steps  # what it would do, once nothing holds it
    assert plan.held == (
        "GPU 0 (NVIDIA A100-SXM4-40GB): the layout must change, but its devices are in use: "
        "MIG-a (7g.40gb) by pod ml/train-0"
    )
    busy_gpu = node(gpu(0), **{"GPU-0": ("process 4242",)})
    assert "GPU-0 (the whole GPU) by process 4242" in plan_one([enabled()], busy_gpu).held
    # A device in use on a GPU that does not change holds nothing back.
    assert plan_one([enabled(("7g.40gb", 1))], held).held == ""


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ((("1g.10gb+me", 1),), "no MIG profile 1g.10gb+me (the GPU has: 1g.10gb, 1g.5gb, "),
        ((("4c.3g.20gb", 1),), "no MIG profile 4c.3g.20gb"),
        ((("1g.5gb+me", 2),), "2 x 1g.5gb+me asked for; the GPU allows 1 at once"),
        ((("2g.10gb", 4),), "4 x 2g.10gb asked for; the GPU allows 3 at once"),
        (
            (("3g.20gb", 2), ("1g.5gb", 2)),
            "2 x 1g.5gb, 2 x 3g.20gb is 8 slices, more slices than the GPU has (7)",
        ),
        (
            (("1g.10gb", 4), ("1g.5gb", 1)),
            "4 x 1g.10gb, 1 x 1g.5gb cannot be placed together on the GPU's placements",
        ),
    ],
)
def test_a_layout_that_cannot_be_made_refuses_the_config_in_one_line(
    devices: tuple[tuple[str, int], ...], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_layout([enabled(*devices)], [node(gpu(1)), node(gpu(0))])
    # The first GPU that cannot take it is named; no plan is made for any.
    assert str(caught.value).startswith("GPU 1 (NVIDIA A100-SXM4-40GB): " + message)
    assert "\n" not in str(caught.value)


def test_a_gpu_instance_with_several_compute_instances_is_destroyed_once_and_whole() -> None:
    shared = [GpuInstance("1c.3g.20gb", Placement(4, 4), 2, ci, f"MIG-{ci}") for ci in range(2)]
    plan = plan_one([enabled(("1c.3g.20gb", 1))], node(gpu(0, mig=True), *shared))
    assert plan.steps == (
        Destroy(2, "1c.3g.20gb", Placement(4, 4)),
        Create("1c.3g.20gb", Placement(0, 4)),
    )
