"""build_resources: MIG strategies, replicas, renames, device selection."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.core.devices import Gpu, physical_id, replica_id
from gpuslice.core.errors import HardwareError
from gpuslice.core.resources import Resource, build_resources, layout_warnings, socket_name
from gpuslice.core.sharing import (
    GPU_RESOURCE,
    MIG_MIXED,
    MIG_NONE,
    MIG_SINGLE,
    MPS,
    NONE,
    TIME_SLICING,
    ReplicaRule,
)

from . import builders as b

SHARED = "nvidia.com/gpu.shared"


def ids(resource: Resource) -> list[str]:
    return [d.id for d in resource.devices]


# --- MIG strategies ---------------------------------------------------------


def test_none_strategy_advertises_mig_enabled_gpus_as_full_gpus() -> None:
    got = b.build(MIG_NONE, b.gpu(0, profiles=["1g.5gb", "1g.5gb"]), b.gpu(1))
    assert list(got) == [GPU_RESOURCE]
    assert ids(got[GPU_RESOURCE]) == [b.gpu_uuid(0), b.gpu_uuid(1)]
    assert not any(d.is_mig for d in got[GPU_RESOURCE].devices)


def test_full_gpu_device_carries_index_path_numa_and_memory() -> None:
    dev = b.build(MIG_NONE, b.gpu(3, numa_node=1, memory_mib=81920))[GPU_RESOURCE].devices[0]
    assert (dev.id, dev.physical_id, dev.gpu_uuid) == (b.gpu_uuid(3),) * 3
    assert (dev.index, dev.paths, dev.numa_node, dev.memory_mib) == (
        "3",
        ("/dev/nvidia3",),
        1,
        81920,
    )
    assert dev.replicas == 1


def test_single_strategy_advertises_mig_devices_as_gpu() -> None:
    got = b.build(
        MIG_SINGLE,
        b.gpu(0, profiles=["1g.5gb"] * 2, numa_node=0),
        b.gpu(1, profiles=["1g.5gb"] * 2, numa_node=1),
    )
    res = got[GPU_RESOURCE]
    assert list(got) == [GPU_RESOURCE]
    assert ids(res) == [b.mig_uuid(g, m) for g in (0, 1) for m in (0, 1)]
    dev = res.devices[3]
    expected = b.mig(1, 1)
    assert dev.is_mig
    assert (dev.index, dev.gpu_uuid, dev.numa_node) == ("1:1", b.gpu_uuid(1), 1)
    assert dev.paths == ("/dev/nvidia1", *expected.cap_paths)
    assert dev.memory_mib == expected.memory_mib


def test_single_strategy_rejects_mixed_mig_enabled_values() -> None:
    with pytest.raises(HardwareError, match="same migEnabled value"):
        b.build(MIG_SINGLE, b.gpu(0, profiles=["1g.5gb"]), b.gpu(1))


def test_single_strategy_rejects_an_empty_mig_enabled_gpu() -> None:
    with pytest.raises(HardwareError, match="GPU 1 has no MIG devices"):
        b.build(MIG_SINGLE, b.gpu(0, profiles=["1g.5gb"]), b.gpu(1, profiles=[]))


def test_single_strategy_rejects_differing_profiles() -> None:
    with pytest.raises(HardwareError, match=r"more than one MIG device type.*1g\.5gb, 2g\.10gb"):
        b.build(MIG_SINGLE, b.gpu(0, profiles=["1g.5gb", "2g.10gb"]), b.gpu(1, profiles=["1g.5gb"]))


def test_single_strategy_on_mig_disabled_node_gives_full_gpus() -> None:
    got = b.build(MIG_SINGLE, *b.gpus(2))
    assert ids(got[GPU_RESOURCE]) == [b.gpu_uuid(0), b.gpu_uuid(1)]


def test_mixed_strategy_names_one_resource_per_profile() -> None:
    got = b.build(
        MIG_MIXED,
        b.gpu(0),
        b.gpu(1, profiles=["3g.20gb", "3g.20gb", "1g.5gb"]),
        b.gpu(2, profiles=["1g.10gb+me"]),
    )
    assert list(got) == [
        GPU_RESOURCE,
        "nvidia.com/mig-1g.10gb.me",
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-3g.20gb",
    ]
    assert ids(got[GPU_RESOURCE]) == [b.gpu_uuid(0)]
    assert ids(got["nvidia.com/mig-3g.20gb"]) == [b.mig_uuid(1, 0), b.mig_uuid(1, 1)]
    assert ids(got["nvidia.com/mig-1g.5gb"]) == [b.mig_uuid(1, 2)]
    assert [d.index for d in got["nvidia.com/mig-1g.10gb.me"].devices] == ["2:0"]
    assert [r.socket_name for r in got.values()] == [
        "nvidia-gpu.sock",
        "nvidia-mig-1g.10gb.me.sock",
        "nvidia-mig-1g.5gb.sock",
        "nvidia-mig-3g.20gb.sock",
    ]


def test_mixed_strategy_accepts_an_empty_mig_gpu_and_skips_it() -> None:
    got = b.build(MIG_MIXED, b.gpu(0), b.gpu(1, profiles=[]), b.gpu(2, profiles=["1g.5gb"]))
    assert ids(got[GPU_RESOURCE]) == [b.gpu_uuid(0)]
    assert ids(got["nvidia.com/mig-1g.5gb"]) == [b.mig_uuid(2, 0)]


def with_compute_sliced(gpu_index: int, profile: str = "1c.3g.20gb", ci_slices: int = 0) -> Gpu:
    """GPU `gpu_index` with a 1g.5gb device and a device of `profile` (slices 3, ci_slices)."""
    small = replace(b.mig(gpu_index, 1, profile), gi_slices=3, ci_slices=ci_slices)
    gpu = b.gpu(gpu_index, profiles=["1g.5gb"])
    return replace(gpu, mig_devices=(*gpu.mig_devices, small))


@pytest.mark.parametrize(
    ("profile", "ci_slices"), [("1c.3g.20gb", 1), ("1c.3g.20gb", 0), ("3g.20gb", 1)]
)
def test_mixed_strategy_rejects_a_compute_instance_smaller_than_its_gpu_instance(
    profile: str, ci_slices: int
) -> None:
    """Upstream's mixed patterns are GPU-instance-sized profiles only, so such a
    device matches none and building fails, naming the GPU, the device and its profile."""
    with pytest.raises(HardwareError) as caught:
        b.build(MIG_MIXED, b.gpu(0), with_compute_sliced(1, profile, ci_slices))
    message = str(caught.value)
    assert "\n" not in message
    assert f"GPU 1 ({b.gpu_uuid(1)})" in message
    assert f"MIG device 1:1 ({b.mig_uuid(1, 1)})" in message
    assert f"profile {profile!r}, which matches no resource pattern" in message


def test_single_strategy_accepts_a_compute_sliced_profile_as_upstream_does() -> None:
    """Upstream's single pattern is "*", so a uniform 1c.3g.20gb node is served."""
    gpu = b.gpu(0, profiles=["1c.3g.20gb", "1c.3g.20gb"])
    assert ids(b.build(MIG_SINGLE, gpu)[GPU_RESOURCE]) == [b.mig_uuid(0, 0), b.mig_uuid(0, 1)]


def test_mixed_strategy_warns_about_an_empty_mig_enabled_gpu() -> None:
    gpus = (b.gpu(0), b.gpu(1, profiles=[]), b.gpu(2, profiles=["1g.5gb"]))
    assert layout_warnings(gpus, MIG_MIXED) == (
        f"migStrategy mixed: MIG-enabled GPU 1 ({b.gpu_uuid(1)}) has no MIG devices; "
        "nothing is advertised from it",
    )
    assert layout_warnings(gpus[::2], MIG_MIXED) == ()
    assert layout_warnings(gpus, MIG_NONE) == ()  # served whole
    assert layout_warnings(gpus, MIG_SINGLE) == ()  # an error there (build_resources)


def test_mixed_strategy_on_all_mig_node_advertises_no_gpu_resource() -> None:
    got = b.build(MIG_MIXED, b.gpu(0, profiles=["1g.5gb"]), b.gpu(1, profiles=["1g.5gb"]))
    assert list(got) == ["nvidia.com/mig-1g.5gb"]


def test_unknown_mig_strategy_is_an_error_naming_the_value() -> None:
    with pytest.raises(
        HardwareError, match="unknown MIG strategy 'both': use none, single or mixed"
    ):
        b.build("both", b.gpu(0))


def test_a_node_without_gpus_advertises_nothing() -> None:
    for strategy in (MIG_NONE, MIG_SINGLE, MIG_MIXED):
        assert b.build(strategy) == {}


# --- replicas -----------------------------------------------------------------


def test_replicas_are_annotated_ids_per_gpu_in_order() -> None:
    res = b.replicated_gpus(2, 3)
    assert ids(res) == [replica_id(b.gpu_uuid(g), n) for g in (0, 1) for n in range(3)]
    assert ids(res)[0] == f"{b.gpu_uuid(0)}::0"
    assert res.name == GPU_RESOURCE


def test_replicas_inherit_the_parent_fields() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=4)
    base = b.build(MIG_NONE, b.gpu(1, numa_node=1))[GPU_RESOURCE].devices[0]
    res = b.build(MIG_NONE, b.gpu(1, numa_node=1), rules=[rule])[GPU_RESOURCE]
    for dev in res.devices:
        assert physical_id(dev.id) == dev.physical_id == base.id
        assert (dev.gpu_uuid, dev.index, dev.paths) == (base.gpu_uuid, base.index, base.paths)
        assert (dev.numa_node, dev.memory_mib, dev.replicas) == (1, base.memory_mib, 4)


@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 8), replicas=st.integers(2, 16))
def test_capacity_is_gpus_times_replicas(count: int, replicas: int) -> None:
    res = b.replicated_gpus(count, replicas)
    assert len(res.devices) == count * replicas
    assert len(set(ids(res))) == count * replicas
    assert res.devices_per_gpu == {b.gpu_uuid(i): replicas for i in range(count)}


def test_replicas_on_a_mig_resource() -> None:
    rule = ReplicaRule(name="nvidia.com/mig-1g.5gb", replicas=3)
    got = b.build(MIG_MIXED, b.gpu(0), b.gpu(1, profiles=["1g.5gb", "3g.20gb"]), rules=[rule])
    mig = got["nvidia.com/mig-1g.5gb"]
    assert ids(mig) == [replica_id(b.mig_uuid(1, 0), n) for n in range(3)]
    assert all(d.is_mig and d.index == "1:0" and d.gpu_uuid == b.gpu_uuid(1) for d in mig.devices)
    assert mig.sharing == TIME_SLICING
    assert got[GPU_RESOURCE].sharing == NONE
    assert got["nvidia.com/mig-3g.20gb"].sharing == NONE


def test_replicas_on_single_strategy_mig_devices() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2)
    got = b.build(MIG_SINGLE, b.gpu(0, profiles=["1g.5gb"] * 2), rules=[rule])
    assert ids(got[GPU_RESOURCE]) == [
        replica_id(b.mig_uuid(0, m), n) for m in (0, 1) for n in (0, 1)
    ]


def test_rename_moves_every_replica_and_drops_the_original() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2, rename=SHARED)
    got = b.build(MIG_NONE, *b.gpus(2), rules=[rule])
    assert list(got) == [SHARED]
    assert len(got[SHARED].devices) == 4
    assert got[SHARED].socket_name == "nvidia-gpu.shared.sock"


def test_rename_of_a_mig_resource_keeps_other_resources() -> None:
    rule = ReplicaRule(
        name="nvidia.com/mig-1g.5gb", replicas=2, rename="nvidia.com/mig-1g.5gb.shared"
    )
    got = b.build(MIG_MIXED, b.gpu(0), b.gpu(1, profiles=["1g.5gb"]), rules=[rule])
    assert list(got) == [GPU_RESOURCE, "nvidia.com/mig-1g.5gb.shared"]
    assert got["nvidia.com/mig-1g.5gb.shared"].socket_name == "nvidia-mig-1g.5gb.shared.sock"


@pytest.mark.parametrize(
    ("name", "sock"),
    [
        ("nvidia.com/gpu", "nvidia-gpu.sock"),
        ("nvidia.com/gpu.shared", "nvidia-gpu.shared.sock"),
        ("nvidia.com/mig-1g.5gb", "nvidia-mig-1g.5gb.sock"),
        ("nvidia.com/mig-1g.10gb.me", "nvidia-mig-1g.10gb.me.sock"),
    ],
)
def test_socket_names_follow_upstream(name: str, sock: str) -> None:
    assert socket_name(name) == sock


def test_rule_for_a_resource_that_does_not_exist_is_ignored() -> None:
    rule = ReplicaRule(name="nvidia.com/mig-1g.5gb", replicas=4, rename="nvidia.com/x.shared")
    got = b.build(MIG_NONE, *b.gpus(2), rules=[rule])
    assert list(got) == [GPU_RESOURCE]
    assert ids(got[GPU_RESOURCE]) == [b.gpu_uuid(0), b.gpu_uuid(1)]
    assert got[GPU_RESOURCE].sharing == NONE


# --- device selection -----------------------------------------------------------


@pytest.mark.parametrize(
    "devices",
    [2, ("0", "1"), (b.gpu_uuid(0), b.gpu_uuid(1)), ("0", b.gpu_uuid(1))],
    ids=["count", "indexes", "uuids", "index-and-uuid"],
)
def test_devices_selection_keeps_unselected_under_the_original_name(
    devices: int | tuple[str, ...],
) -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2, rename=SHARED, devices=devices)
    got = b.build(MIG_NONE, *b.gpus(3), rules=[rule])
    assert ids(got[GPU_RESOURCE]) == [b.gpu_uuid(2)]
    assert ids(got[SHARED]) == [replica_id(b.gpu_uuid(g), n) for g in (0, 1) for n in (0, 1)]
    assert got[GPU_RESOURCE].sharing == NONE
    assert got[SHARED].sharing == TIME_SLICING


def test_devices_selection_without_rename_mixes_whole_and_replicated() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2, devices=("1",))
    res = b.build(MIG_NONE, *b.gpus(2), rules=[rule])[GPU_RESOURCE]
    assert ids(res) == [b.gpu_uuid(0), replica_id(b.gpu_uuid(1), 0), replica_id(b.gpu_uuid(1), 1)]
    assert [d.replicas for d in res.devices] == [1, 2, 2]


def test_devices_selection_by_mig_index() -> None:
    rule = ReplicaRule(name="nvidia.com/mig-1g.5gb", replicas=2, devices=("0:1",))
    got = b.build(MIG_MIXED, b.gpu(0, profiles=["1g.5gb"] * 2), rules=[rule])
    assert ids(got["nvidia.com/mig-1g.5gb"]) == [
        b.mig_uuid(0, 0),
        replica_id(b.mig_uuid(0, 1), 0),
        replica_id(b.mig_uuid(0, 1), 1),
    ]


def test_count_larger_than_the_device_count_selects_all() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2, rename=SHARED, devices=9)
    assert list(b.build(MIG_NONE, *b.gpus(2), rules=[rule])) == [SHARED]


def test_selection_matching_nothing_advertises_no_empty_resource() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2, rename=SHARED, devices=("7",))
    got = b.build(MIG_NONE, *b.gpus(2), rules=[rule])
    assert list(got) == [GPU_RESOURCE]
    assert got[GPU_RESOURCE].sharing == NONE


# --- the Resource value -----------------------------------------------------------


def test_device_lookup_by_id() -> None:
    res = b.replicated_gpus(2, 2)
    rid = replica_id(b.gpu_uuid(1), 1)
    found = res.device(rid)
    assert found is not None
    assert (found.id, found.gpu_uuid) == (rid, b.gpu_uuid(1))
    assert res.device(b.gpu_uuid(1)) is None
    assert res.device("GPU-nope") is None


def test_devices_per_gpu_counts_mig_devices_under_their_parent() -> None:
    res = b.build(MIG_SINGLE, b.gpu(0, profiles=["1g.5gb"] * 3), b.gpu(1, profiles=["1g.5gb"]))
    assert res[GPU_RESOURCE].devices_per_gpu == {b.gpu_uuid(0): 3, b.gpu_uuid(1): 1}


def test_replicated_and_whole_gpus_flags() -> None:
    whole = b.build(MIG_NONE, *b.gpus(2))[GPU_RESOURCE]
    mig = b.build(MIG_SINGLE, b.gpu(0, profiles=["1g.5gb"]))[GPU_RESOURCE]
    shared = b.replicated_gpus(2, 2)
    assert (whole.whole_gpus, whole.replicated) == (True, False)
    assert (mig.whole_gpus, mig.replicated) == (False, False)
    assert (shared.whole_gpus, shared.replicated) == (False, True)


def test_sharing_strategy_and_fail_flag_reach_the_replicated_resource() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2, rename=SHARED, devices=1)
    plan = b.settings(MIG_NONE, rule, strategy=MPS, fail_requests_greater_than_one=True)
    got = b.by_name(build_resources(b.snapshot(*b.gpus(2)), plan))
    assert got[SHARED].sharing == MPS
    assert got[SHARED].fail_requests_greater_than_one
    assert got[GPU_RESOURCE].sharing == NONE


def test_resources_come_sorted_by_name() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2, rename="nvidia.com/a.shared", devices=1)
    got = build_resources(b.snapshot(*b.gpus(2)), b.settings(MIG_NONE, rule))
    assert [r.name for r in got] == ["nvidia.com/a.shared", GPU_RESOURCE]


def test_selection_matching_nothing_leaves_the_resource_unshared() -> None:
    """A rule that replicates no device must not mark its resource as shared
    (which would bring MPS mounts and the one-replica limit to whole GPUs)."""
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2, devices=("7",))
    plan = b.settings(MIG_NONE, rule, strategy=MPS)
    res = b.only(build_resources(b.snapshot(*b.gpus(2)), plan))
    assert ids(res) == [b.gpu_uuid(0), b.gpu_uuid(1)]
    assert res.sharing == NONE


# --- MPS and MIG -----------------------------------------------------------------


@pytest.mark.parametrize("strategy", [MIG_NONE, MIG_SINGLE])
def test_mps_on_a_node_with_a_mig_enabled_gpu_is_refused_naming_the_gpu(strategy: str) -> None:
    """Upstream refuses MPS on MIG; serving replicas there would promise sharing that the
    MPS daemon cannot give."""
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=4)
    plan = b.settings(strategy, rule, strategy=MPS)
    node = b.snapshot(b.gpu(0, profiles=["1g.5gb"]), b.gpu(1, profiles=["1g.5gb"]))
    with pytest.raises(HardwareError) as caught:
        build_resources(node, plan)
    assert str(caught.value) == (
        f"sharing.mps: GPU 0 ({b.gpu_uuid(0)}) has MIG enabled, and MPS cannot share a "
        "MIG-enabled GPU (as upstream); disable MIG on it or share with timeSlicing"
    )


def test_mps_on_mig_capable_gpus_with_mig_disabled_is_served() -> None:
    plan = b.settings(MIG_NONE, ReplicaRule(name=GPU_RESOURCE, replicas=4), strategy=MPS)
    got = b.only(build_resources(b.snapshot(*b.gpus(2)), plan))
    assert (len(got.devices), got.sharing) == (8, MPS)


def test_time_slicing_on_a_mig_enabled_gpu_is_still_served() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2)
    got = b.build(MIG_SINGLE, b.gpu(0, profiles=["1g.5gb"]), rules=[rule])
    assert len(got[GPU_RESOURCE].devices) == 2


# --- sharing rules that match nothing on this node -------------------------------


def test_a_rule_for_a_resource_the_node_lacks_is_a_layout_warning() -> None:
    """A T4 node given a MIG rule (or a MIG node given a GPU rule) shares nothing; say so."""
    mig_rule = ReplicaRule(name="nvidia.com/mig-1g.5gb", replicas=4)
    plan = b.settings(MIG_NONE, mig_rule, ReplicaRule(name=GPU_RESOURCE, replicas=2))
    assert layout_warnings(b.gpus(2), plan) == (
        "sharing: nvidia.com/mig-1g.5gb matches no device of this node (migStrategy none; "
        "it has nvidia.com/gpu); nothing is shared under that name",
    )
    all_mig = (b.gpu(0, profiles=["1g.5gb"]),)
    assert layout_warnings(all_mig, b.settings(MIG_MIXED, mig_rule)) == ()
    gpu_rule = b.settings(MIG_MIXED, ReplicaRule(name=GPU_RESOURCE, replicas=2))
    assert layout_warnings(all_mig, gpu_rule) == (
        "sharing: nvidia.com/gpu matches no device of this node (migStrategy mixed; "
        "it has nvidia.com/mig-1g.5gb); nothing is shared under that name",
    )


def test_a_rule_on_a_node_without_gpus_warns_once_per_name() -> None:
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2)
    assert layout_warnings((), b.settings(MIG_NONE, rule, rule)) == (
        "sharing: nvidia.com/gpu matches no device of this node (migStrategy none; "
        "it has no resources); nothing is shared under that name",
    )


def test_layout_warnings_of_a_strategy_alone_know_no_rules() -> None:
    gpus = (b.gpu(0, profiles=[]),)
    assert layout_warnings(gpus, MIG_MIXED) == layout_warnings(gpus, b.settings(MIG_MIXED))
    assert layout_warnings(b.gpus(1), MIG_NONE) == ()


def test_a_layout_that_breaks_the_strategy_gives_no_rule_warning() -> None:
    """build_resources reports the layout itself; the warnings do not guess."""
    rule = ReplicaRule(name=GPU_RESOURCE, replicas=2)
    mixed_modes = (b.gpu(0), b.gpu(1, profiles=["1g.5gb"]))
    assert layout_warnings(mixed_modes, b.settings(MIG_SINGLE, rule)) == ()
