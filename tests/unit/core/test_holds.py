"""Which devices are held back (core.holds): hardware the kubelet has allocated under
another resource name, or under this name in another form, is held; allocations the
kubelet counts against the same list, other MIG devices of a GPU, other vendors' index
IDs and devices of other nodes are not."""

from __future__ import annotations

import pytest

from gpuslice.core.devices import Gpu, replica_id
from gpuslice.core.holds import held, in_use
from gpuslice.core.resources import Resource, build_resources
from gpuslice.core.sharing import GPU_RESOURCE, MIG_MIXED, MIG_NONE, ReplicaRule
from gpuslice.core.usage import ContainerDevices

from . import builders as b

SHARED = "nvidia.com/gpu.shared"
MIG = "nvidia.com/mig-1g.5gb"
MIG2 = "nvidia.com/mig-2g.10gb"
MIG_SHARED = "nvidia.com/mig-1g.5gb.shared"
G0, G2 = b.gpu_uuid(0), b.gpu_uuid(2)
M00, M01, M02 = b.mig_uuid(0, 0), b.mig_uuid(0, 1), b.mig_uuid(0, 2)

# Four GPUs: 0 and 1 whole as nvidia.com/gpu, 2 and 3 in 4 replicas as gpu.shared.
SPLIT = (MIG_NONE, b.gpus(4), [ReplicaRule(GPU_RESOURCE, 4, SHARED, ("2", "3"), "r[0]")])
# Two GPUs in 4 replicas each under nvidia.com/gpu itself.
REPLICATED = (MIG_NONE, b.gpus(2), [ReplicaRule(GPU_RESOURCE, 4, "", None, "r[0]")])
# GPU 0 in MIG mode (mixed): 1g.5gb 0:0 in 2 replicas as mig-1g.5gb.shared, 0:1 as
# mig-1g.5gb, 0:2 as mig-2g.10gb.
MIGS = b.gpu(0, profiles=["1g.5gb", "1g.5gb", "2g.10gb"])
MIXED = (MIG_MIXED, (MIGS,), [ReplicaRule(MIG, 2, MIG_SHARED, ("0:0",), "r[0]")])

Layout = tuple[str, tuple[Gpu, ...], list[ReplicaRule]]


def resources(layout: Layout) -> tuple[Resource, ...]:
    strategy, gpus, rules = layout
    return build_resources(b.snapshot(*gpus), b.settings(strategy, *rules))


CASES = [
    # (what it shows, layout, allocations as (resource, IDs), held UUIDs)
    ("nothing allocated", SPLIT, [], set()),
    ("a whole GPU its own resource still lists", SPLIT, [(GPU_RESOURCE, [G0])], set()),
    ("a replica its own resource still lists", SPLIT, [(SHARED, [replica_id(G2, 1)])], set()),
    ("a whole GPU moved into replicas", SPLIT, [(GPU_RESOURCE, [G2])], {G2}),
    ("a replicated GPU moved to whole", SPLIT, [(SHARED, [replica_id(G0, 3)])], {G0}),
    ("the index strategy's IDs", SPLIT, [(GPU_RESOURCE, ["2"])], {G2}),
    ("another vendor's index IDs", SPLIT, [("example.com/nic", ["2"])], set()),
    ("a device of another node", SPLIT, [(GPU_RESOURCE, ["GPU-elsewhere"])], set()),
    ("a replica count changed", REPLICATED, [(GPU_RESOURCE, [replica_id(G0, 7)])], set()),
    ("a whole GPU now replicated, same name", REPLICATED, [(GPU_RESOURCE, [G0])], {G0}),
    ("a MIG device its resource still lists", MIXED, [(MIG, [M01]), (MIG2, [M02])], set()),
    ("a MIG device moved into replicas", MIXED, [(MIG, [M00])], {M00}),
    ("a whole GPU now in MIG mode", MIXED, [(GPU_RESOURCE, [G0])], {M00, M01, M02}),
    ("MIG by index, moved", MIXED, [(MIG, ["0:0"])], {M00}),
]


@pytest.mark.parametrize(
    ("layout", "allocated", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_held(layout: Layout, allocated: list[tuple[str, list[str]]], expected: set[str]) -> None:
    served = resources(layout)
    listed = [
        ContainerDevices("ns", "pod", f"c{i}", r, tuple(ids))
        for i, (r, ids) in enumerate(allocated)
    ]
    gpus = layout[1]
    used = in_use(listed, b.snapshot(*gpus), [r.name for r in served])
    assert held(served, used) == expected


def test_index_ids_count_under_a_served_name_outside_nvidia_com() -> None:
    """A rename to another domain is ours too: its index IDs map to this node's GPUs."""
    listed = [ContainerDevices("ns", "pod", "c", "example.com/gpu", ("2",))]
    used = in_use(listed, b.snapshot(*b.gpus(4)), ["example.com/gpu"])
    assert {(u.gpu_uuid, u.mig_uuid) for u in used} == {(G2, "")}
    assert in_use(listed, b.snapshot(*b.gpus(4))) == frozenset()
