"""Per-GPU sharing in resource building (core.placement through build_resources):
device selection by count, index and UUID, determinism, collisions, and the per-node
warnings for references and counts this node cannot honour."""

from __future__ import annotations

from collections import Counter

import pytest

from gpuslice.core.allocation import preferred_allocation
from gpuslice.core.devices import physical_id, replica_id
from gpuslice.core.errors import HardwareError
from gpuslice.core.resources import Resource, build_resources, layout_warnings
from gpuslice.core.response import DISTRIBUTED
from gpuslice.core.sharing import GPU_RESOURCE, MIG_MIXED, MIG_NONE, MPS, ReplicaRule

from . import builders as b

SHARED = "nvidia.com/gpu.shared"
SMALL = "nvidia.com/gpu.small"
MIG = "nvidia.com/mig-1g.5gb"


def rule(
    devices: int | tuple[str, ...] | None,
    replicas: int = 4,
    rename: str = SHARED,
    *,
    name: str = GPU_RESOURCE,
    at: int = 0,
) -> ReplicaRule:
    path = f"sharing.timeSlicing.resources[{at}]"
    return ReplicaRule(name, replicas, rename, devices, path)


def gpus_of(res: Resource) -> list[str]:
    return list(dict.fromkeys(physical_id(d.id) for d in res.devices))


def test_whole_and_shared_gpus_under_two_names() -> None:
    """The node of the issue: 2 whole GPUs as nvidia.com/gpu, 6 x 4 replicas as shared."""
    got = b.build(MIG_NONE, *b.gpus(8), rules=[rule(("2", "3", "4", "5", "6", "7"))])
    assert gpus_of(got[GPU_RESOURCE]) == [b.gpu_uuid(0), b.gpu_uuid(1)]
    assert len(got[SHARED].devices) == 24
    assert {d.replicas for d in got[GPU_RESOURCE].devices} == {1}


def test_a_count_takes_the_lowest_indexes_whatever_the_hardware_order() -> None:
    """The same GPUs on every start, whatever order the backend lists them in."""
    ordered = b.build(MIG_NONE, *b.gpus(4), rules=[rule(2)])
    shuffled = b.build(MIG_NONE, *reversed(b.gpus(4)), rules=[rule(2)])
    assert ordered == shuffled
    assert gpus_of(ordered[SHARED]) == [b.gpu_uuid(0), b.gpu_uuid(1)]
    assert [d.index for d in shuffled[GPU_RESOURCE].devices] == ["2", "3"]


def test_counts_take_in_entry_order_what_lists_left() -> None:
    """Lists first (GPU 0), then each count the lowest indexes left: 1-2, then 3."""
    rules = [rule(2, at=0), rule(("0",), 8, SMALL, at=1), rule(1, 2, "nvidia.com/gpu.x", at=2)]
    got = b.build(MIG_NONE, *b.gpus(5), rules=rules)
    assert gpus_of(got[SMALL]) == [b.gpu_uuid(0)]
    assert gpus_of(got[SHARED]) == [b.gpu_uuid(1), b.gpu_uuid(2)]
    assert gpus_of(got["nvidia.com/gpu.x"]) == [b.gpu_uuid(3)]
    assert gpus_of(got[GPU_RESOURCE]) == [b.gpu_uuid(4)]


def test_uuids_match_in_either_case_and_indexes_without_leading_zeros() -> None:
    refs = (b.gpu_uuid(1).upper(), "02")
    got = b.build(MIG_NONE, *b.gpus(3), rules=[rule(refs)])
    assert gpus_of(got[SHARED]) == [b.gpu_uuid(1), b.gpu_uuid(2)]


@pytest.mark.parametrize(
    "ref",
    ["0:1", b.mig_uuid(0, 1), f"MIG-{b.gpu_uuid(0)}/2/0"],
    ids=["mig-index", "mig-uuid", "pre-r470-mig-uuid"],
)
def test_a_mig_device_is_selected_by_index_or_either_uuid_form(ref: str) -> None:
    mig_rule = rule((ref,), 2, MIG + ".shared", name=MIG)
    got = b.build(MIG_MIXED, b.gpu(0, profiles=["1g.5gb"] * 3), rules=[mig_rule])
    assert gpus_of(got[MIG + ".shared"]) == [b.mig_uuid(0, 1)]
    assert gpus_of(got[MIG]) == [b.mig_uuid(0, 0), b.mig_uuid(0, 2)]


def test_two_entries_of_one_name_give_different_replicas_per_gpu() -> None:
    """Time-slicing: one resource, GPU 0 in 2 replicas and GPU 1 in 8; no GPU twice."""
    rules = [rule(("0",), 2, "", at=0), rule(("1",), 8, "", at=1)]
    res = b.build(MIG_NONE, *b.gpus(2), rules=rules)[GPU_RESOURCE]
    assert Counter(physical_id(d.id) for d in res.devices) == {
        b.gpu_uuid(0): 2,
        b.gpu_uuid(1): 8,
    }


def test_mixed_replicas_are_spread_by_the_share_in_use() -> None:
    """Distributed allocation with 2 and 8 replicas: after one pod on each GPU, the next
    goes to the 8-replica GPU (1/8 in use) rather than the 2-replica one (1/2)."""
    rules = [rule(("0",), 2, "", at=0), rule(("1",), 8, "", at=1)]
    res = b.build(MIG_NONE, *b.gpus(2), rules=rules)[GPU_RESOURCE]
    taken = {replica_id(b.gpu_uuid(0), 0), replica_id(b.gpu_uuid(1), 0)}
    free = [d.id for d in res.devices if d.id not in taken]
    got = preferred_allocation(res, free, [], 1, policy=DISTRIBUTED)
    assert physical_id(got[0]) == b.gpu_uuid(1)


def test_all_selects_every_device() -> None:
    got = b.build(MIG_NONE, *b.gpus(2), rules=[rule(None)])
    assert list(got) == [SHARED]


def test_a_gpu_selected_by_two_entries_is_refused_naming_both() -> None:
    rules = [rule(("0", "1"), at=0), rule((b.gpu_uuid(1),), 8, SMALL, at=1)]
    with pytest.raises(HardwareError) as caught:
        b.build(MIG_NONE, *b.gpus(2), rules=rules)
    assert str(caught.value) == (
        f"sharing.timeSlicing.resources[1]: device 1 ({b.gpu_uuid(1)}) is already selected "
        "by sharing.timeSlicing.resources[0]; a device may be in one entry only"
    )


def test_a_rename_onto_another_resource_of_the_node_is_refused() -> None:
    """MIG devices renamed to nvidia.com/gpu would be served with the whole GPUs."""
    mig_rule = rule(None, 2, GPU_RESOURCE, name=MIG)
    with pytest.raises(HardwareError, match=r"nvidia.com/gpu would serve devices of both"):
        b.build(MIG_MIXED, b.gpu(0), b.gpu(1, profiles=["1g.5gb"]), rules=[mig_rule])


def test_mps_refuses_one_name_with_whole_and_replicated_gpus() -> None:
    """Under MPS one daemon's thread limit serves a resource: one replica count each."""
    plan = b.settings(MIG_NONE, rule(("0",), 4, ""), strategy=MPS)
    with pytest.raises(HardwareError) as caught:
        build_resources(b.snapshot(*b.gpus(2)), plan)
    assert str(caught.value) == (
        "sharing.timeSlicing.resources[0]: under sharing.mps every device of nvidia.com/gpu "
        "needs the same replicas, but device 0 would be 4 replicas and device 1 whole; "
        "select every device of nvidia.com/gpu or rename the entry "
        "(rename: nvidia.com/gpu.shared)"
    )


def test_mps_serves_a_renamed_subset() -> None:
    plan = b.settings(MIG_NONE, rule(("0",), 4), strategy=MPS)
    got = b.by_name(build_resources(b.snapshot(*b.gpus(2)), plan))
    assert (len(got[SHARED].devices), got[SHARED].sharing) == (4, MPS)
    assert got[GPU_RESOURCE].sharing == "none"


def test_an_unknown_uuid_or_index_is_a_warning_and_the_rest_is_served() -> None:
    """One ConfigMap serves many nodes: a GPU this node lacks is skipped, never fatal."""
    other = "GPU-99999999-1111-2222-3333-444444444444"
    settings = b.settings(MIG_NONE, rule(("1", other, "7")))
    gpus = b.gpus(2)
    got = b.by_name(build_resources(b.snapshot(*gpus), settings))
    assert gpus_of(got[SHARED]) == [b.gpu_uuid(1)]
    assert layout_warnings(gpus, settings) == (
        f'sharing.timeSlicing.resources[0].devices: "{other}" matches no nvidia.com/gpu here '
        "(this node has no such device); skipped",
        'sharing.timeSlicing.resources[0].devices: "7" matches no nvidia.com/gpu here '
        "(this node has no such device); skipped",
    )


def test_a_reference_to_a_device_of_another_resource_says_which() -> None:
    settings = b.settings(MIG_MIXED, rule(("0",), 2, MIG + ".shared", name=MIG))
    gpus = (b.gpu(0), b.gpu(1, profiles=["1g.5gb"]))
    assert layout_warnings(gpus, settings) == (
        f'sharing.timeSlicing.resources[0].devices: "0" matches no {MIG} here '
        "(it is served as nvidia.com/gpu, not nvidia.com/mig-1g.5gb); skipped",
    )


def test_a_count_larger_than_the_node_is_a_warning_and_shares_what_there_is() -> None:
    settings = b.settings(MIG_NONE, rule(6))
    gpus = b.gpus(4)
    assert list(b.by_name(build_resources(b.snapshot(*gpus), settings))) == [SHARED]
    assert layout_warnings(gpus, settings) == (
        "sharing.timeSlicing.resources[0].devices: asks for 6 devices of nvidia.com/gpu; "
        "this node has 4 not taken by other entries, so 4 are shared",
    )


def test_two_builds_of_the_same_config_are_equal() -> None:
    rules = [rule(2, at=0), rule(("3",), 8, SMALL, at=1)]
    first = build_resources(b.snapshot(*b.gpus(4)), b.settings(MIG_NONE, *rules))
    again = build_resources(b.snapshot(*b.gpus(4)), b.settings(MIG_NONE, *rules))
    assert first == again
