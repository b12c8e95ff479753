"""preferred_allocation and validate_allocate: properties, policies, errors."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.core.allocation import known_devices, preferred_allocation, validate_allocate
from gpuslice.core.devices import replica_id
from gpuslice.core.errors import InvalidRequest
from gpuslice.core.resources import Resource, build_resources
from gpuslice.core.response import DISTRIBUTED, PACKED
from gpuslice.core.sharing import MIG_NONE, MIG_SINGLE, MPS, TIME_SLICING, ReplicaRule
from gpuslice.core.topology import Topology

from . import builders as b

POLICIES = (DISTRIBUTED, PACKED)
FAST = settings(max_examples=150, deadline=None)


@dataclass(frozen=True)
class Request:
    resource: Resource
    available: list[str]
    must_include: list[str]
    size: int

    def run(self, policy: str) -> list[str]:
        return preferred_allocation(
            self.resource, self.available, self.must_include, self.size, policy=policy
        )

    def gpu_of(self, device_id: str) -> str:
        dev = self.resource.device(device_id)
        assert dev is not None
        return dev.gpu_uuid

    def allocated(self) -> Counter[str]:
        """Devices per GPU the kubelet has already handed out (not available)."""
        free = Counter(self.gpu_of(i) for i in self.available)
        return Counter({g: n - free[g] for g, n in self.resource.devices_per_gpu.items()})

    def free_gpus(self) -> set[str]:
        """GPUs with an available device that is not must-include."""
        return {self.gpu_of(i) for i in self.available if i not in self.must_include}


@st.composite
def resources(draw: st.DrawFn) -> Resource:
    """Whole GPUs, replicated GPUs or (replicated) single-strategy MIG devices
    over 1-6 GPUs, with 1-8 replicas."""
    count = draw(st.integers(1, 6))
    replicas = draw(st.integers(1, 8))
    if draw(st.booleans()):
        gpus = tuple(b.gpu(i, profiles=["1g.5gb"] * draw(st.integers(1, 3))) for i in range(count))
        mig_strategy = MIG_SINGLE
    else:
        gpus, mig_strategy = b.gpus(count), MIG_NONE
    rules = (ReplicaRule(name="nvidia.com/gpu", replicas=replicas),) if replicas > 1 else ()
    return b.only(build_resources(b.snapshot(*gpus), b.settings(mig_strategy, *rules)))


@st.composite
def requests(draw: st.DrawFn, with_must: bool = True) -> Request:
    resource = draw(resources())
    all_ids = [d.id for d in resource.devices]
    available = draw(st.lists(st.sampled_from(all_ids), min_size=1, unique=True))
    must: list[str] = []
    if with_must:
        must = draw(st.lists(st.sampled_from(available), unique=True))
    size = draw(st.integers(max(1, len(must)), len(available)))
    return Request(resource, available, must, size)


# --- properties of every answer ---------------------------------------------------


@FAST
@given(req=requests(), policy=st.sampled_from(POLICIES))
def test_answer_is_size_distinct_available_devices_with_must_include_first(
    req: Request, policy: str
) -> None:
    got = req.run(policy)
    assert len(got) == req.size
    assert len(set(got)) == req.size
    assert set(got) <= set(req.available)
    assert got[: len(req.must_include)] == req.must_include
    assert req.run(policy) == got


@FAST
@given(req=requests())
def test_distributed_covers_as_many_physical_gpus_as_possible(req: Request) -> None:
    """Distinct physical GPUs first: the answer spans the must-include GPUs plus
    one new GPU per remaining pick while GPUs with a free device remain."""
    got = req.run(DISTRIBUTED)
    required = {req.gpu_of(i) for i in req.must_include}
    needed = req.size - len(req.must_include)
    expected = len(required) + min(needed, len(req.free_gpus() - required))
    assert len({req.gpu_of(i) for i in got}) == expected


@FAST
@given(req=requests(with_must=False))
def test_distributed_spreads_then_prefers_the_least_allocated_gpus(req: Request) -> None:
    got = req.run(DISTRIBUTED)
    candidates = req.free_gpus()
    spread = min(req.size, len(candidates))
    first = [req.gpu_of(i) for i in got[:spread]]
    assert len(set(first)) == spread
    allocated = req.allocated()
    untouched = candidates - set(first)
    if untouched:
        assert max(allocated[g] for g in first) <= min(allocated[g] for g in untouched)


@FAST
@given(req=requests(with_must=False))
def test_packed_drains_the_most_allocated_gpus_first(req: Request) -> None:
    """Picks come in one block per GPU, from the most allocated GPU down; every
    block but the last takes all of its GPU's free devices."""
    got = req.run(PACKED)
    order = [req.gpu_of(i) for i in got]
    blocks = list(dict.fromkeys(order))
    assert order == [g for g in blocks for _ in range(order.count(g))]
    free = Counter(req.gpu_of(i) for i in req.available)
    assert all(order.count(g) == free[g] for g in blocks[:-1])
    allocated = req.allocated()
    loads = [allocated[g] for g in blocks]
    assert loads == sorted(loads, reverse=True)
    untouched = req.free_gpus() - set(blocks)
    if untouched:
        assert loads[-1] >= max(allocated[g] for g in untouched)


@FAST
@given(req=requests(with_must=False))
def test_packed_request_that_fits_the_most_allocated_gpu_lands_there(req: Request) -> None:
    allocated = req.allocated()
    free = Counter(req.gpu_of(i) for i in req.available)
    top = max(allocated[g] for g in free)
    room = min(free[g] for g in free if allocated[g] == top)
    if req.size <= room:
        gpus = {req.gpu_of(i) for i in req.run(PACKED)}
        assert len(gpus) == 1
        assert allocated[gpus.pop()] == top


# --- worked examples ------------------------------------------------------------


def _half_used() -> tuple[Resource, list[str]]:
    """Two GPUs with 4 replicas each; GPU 0 already has 2 replicas in use."""
    res = b.replicated_gpus(2, 4)
    g0, g1 = b.gpu_uuid(0), b.gpu_uuid(1)
    available = [replica_id(g0, 2), replica_id(g0, 3), *(replica_id(g1, n) for n in range(4))]
    return res, available


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1, [(1, 0)]),
        (2, [(1, 0), (0, 2)]),
        (3, [(1, 0), (0, 2), (1, 1)]),
    ],
)
def test_distributed_example(size: int, expected: list[tuple[int, int]]) -> None:
    res, available = _half_used()
    got = preferred_allocation(res, available, [], size, policy=DISTRIBUTED)
    assert got == [replica_id(b.gpu_uuid(g), n) for g, n in expected]


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1, [(0, 2)]),
        (2, [(0, 2), (0, 3)]),
        (3, [(0, 2), (0, 3), (1, 0)]),
    ],
)
def test_packed_example(size: int, expected: list[tuple[int, int]]) -> None:
    res, available = _half_used()
    got = preferred_allocation(res, available, [], size, policy=PACKED)
    assert got == [replica_id(b.gpu_uuid(g), n) for g, n in expected]


def test_packed_counts_must_include_devices_as_load() -> None:
    """GPU 0 has one replica in use; two must-include replicas make GPU 1 the
    more loaded one, so the remaining pick joins them there."""
    res = b.replicated_gpus(2, 4)
    g0, g1 = b.gpu_uuid(0), b.gpu_uuid(1)
    available = [*(replica_id(g0, n) for n in (1, 2, 3)), *(replica_id(g1, n) for n in range(4))]
    must = [replica_id(g1, 2), replica_id(g1, 3)]
    got = preferred_allocation(res, available, must, 3, policy=PACKED)
    assert got == [*must, replica_id(g1, 0)]


def test_distributed_avoids_the_gpu_of_a_must_include_device() -> None:
    res = b.replicated_gpus(3, 2)
    available = [d.id for d in res.devices]
    must = [replica_id(b.gpu_uuid(0), 0)]
    got = preferred_allocation(res, available, must, 3, policy=DISTRIBUTED)
    assert got == [*must, replica_id(b.gpu_uuid(1), 0), replica_id(b.gpu_uuid(2), 0)]


# --- whole GPUs with topology ---------------------------------------------------


def _islands() -> tuple[Resource, Topology]:
    """Four whole GPUs in two NVLink islands: {0, 1} and {2, 3}."""
    snap = b.snapshot(
        b.gpu(0, nvlinks=[(1, 4)]),
        b.gpu(1, nvlinks=[(0, 4)]),
        b.gpu(2, nvlinks=[(3, 4)]),
        b.gpu(3, nvlinks=[(2, 4)]),
    )
    return b.only(build_resources(snap, b.settings())), Topology.from_snapshot(snap)


@pytest.mark.parametrize(("must", "peer"), [(1, 0), (0, 1), (2, 3), (3, 2)])
@pytest.mark.parametrize("policy", POLICIES)
def test_whole_gpus_take_the_nvlink_peer_of_a_must_include(
    must: int, peer: int, policy: str
) -> None:
    res, topo = _islands()
    available = [b.gpu_uuid(i) for i in (3, 1, 0, 2)]
    got = preferred_allocation(res, available, [b.gpu_uuid(must)], 2, policy=policy, topology=topo)
    assert got == [b.gpu_uuid(must), b.gpu_uuid(peer)]


def test_whole_gpus_pick_a_linked_pair_over_a_broken_island() -> None:
    res, topo = _islands()
    available = [b.gpu_uuid(i) for i in (1, 2, 3)]
    got = preferred_allocation(res, available, [], 2, policy=DISTRIBUTED, topology=topo)
    assert got == [b.gpu_uuid(2), b.gpu_uuid(3)]


def test_whole_gpus_size_equal_to_available_returns_all() -> None:
    res, topo = _islands()
    available = [b.gpu_uuid(i) for i in (3, 1, 0, 2)]
    must = [b.gpu_uuid(2)]
    got = preferred_allocation(res, available, must, 4, policy=DISTRIBUTED, topology=topo)
    assert got[0] == must[0]
    assert sorted(got) == sorted(available)


def test_topology_is_not_used_for_replicas() -> None:
    """Replicas follow the greedy policy even when a topology is given."""
    snap = b.snapshot(b.gpu(0, nvlinks=[(1, 4)]), b.gpu(1, nvlinks=[(0, 4)]), b.gpu(2))
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=2)
    res = b.only(build_resources(snap, b.settings(MIG_NONE, rule)))
    available = [d.id for d in res.devices]
    must = [replica_id(b.gpu_uuid(0), 0)]
    got = preferred_allocation(
        res, available, must, 2, policy=DISTRIBUTED, topology=Topology.from_snapshot(snap)
    )
    assert got == [*must, replica_id(b.gpu_uuid(1), 0)]
    got_plain = preferred_allocation(res, available, must, 2, policy=DISTRIBUTED)
    assert got == got_plain


# --- preferred_allocation errors --------------------------------------------------


def _gpu_ids(count: int = 3) -> tuple[Resource, list[str]]:
    res = b.replicated_gpus(count, 2)
    return res, [d.id for d in res.devices]


@pytest.mark.parametrize("size", [0, -1])
def test_size_below_one_is_rejected(size: int) -> None:
    res, ids = _gpu_ids()
    with pytest.raises(InvalidRequest, match=f"allocation size must be at least 1, got {size}"):
        preferred_allocation(res, ids, [], size, policy=DISTRIBUTED)


def test_unknown_available_id_is_rejected() -> None:
    res, ids = _gpu_ids()
    with pytest.raises(InvalidRequest, match="available devices: unknown device 'GPU-x::0'"):
        preferred_allocation(res, [*ids, "GPU-x::0"], [], 1, policy=DISTRIBUTED)


def test_unknown_must_include_id_is_rejected() -> None:
    res, ids = _gpu_ids()
    with pytest.raises(InvalidRequest, match="must-include devices: unknown device 'GPU-x'"):
        preferred_allocation(res, ids, ["GPU-x"], 1, policy=DISTRIBUTED)


def test_duplicate_ids_are_rejected() -> None:
    res, ids = _gpu_ids()
    with pytest.raises(InvalidRequest, match=f"device '{ids[1]}' listed more than once"):
        preferred_allocation(res, [*ids, ids[1]], [], 1, policy=DISTRIBUTED)
    with pytest.raises(InvalidRequest, match=f"device '{ids[0]}' listed more than once"):
        preferred_allocation(res, ids, [ids[0], ids[0]], 2, policy=DISTRIBUTED)


def test_must_include_outside_available_is_rejected() -> None:
    res, ids = _gpu_ids()
    with pytest.raises(InvalidRequest, match=f"must-include device '{ids[0]}' is not among"):
        preferred_allocation(res, ids[1:], [ids[0]], 2, policy=DISTRIBUTED)


def test_more_must_include_than_size_is_rejected() -> None:
    res, ids = _gpu_ids()
    with pytest.raises(InvalidRequest, match="2 must-include devices exceed the allocation size 1"):
        preferred_allocation(res, ids, ids[:2], 1, policy=DISTRIBUTED)


def test_size_above_available_is_rejected() -> None:
    res, ids = _gpu_ids()
    with pytest.raises(InvalidRequest, match=r"not enough available devices.*3 requested, 2 avail"):
        preferred_allocation(res, ids[:2], [], 3, policy=PACKED)


# --- validate_allocate ----------------------------------------------------------


def _shared(
    strategy: str = TIME_SLICING, *, fail: bool = True, devices: int | None = None
) -> Resource:
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=4, devices=devices)
    plan = b.settings(MIG_NONE, rule, strategy=strategy, fail_requests_greater_than_one=fail)
    return b.only(build_resources(b.snapshot(*b.gpus(2)), plan))


def test_validate_returns_the_devices_in_request_order() -> None:
    res = _shared(fail=False)
    ids = [replica_id(b.gpu_uuid(1), 3), replica_id(b.gpu_uuid(0), 0)]
    assert [d.id for d in validate_allocate(res, ids)] == ids


def test_validate_rejects_unknown_duplicate_and_empty_requests() -> None:
    res = _shared(fail=False)
    rid = replica_id(b.gpu_uuid(0), 0)
    with pytest.raises(InvalidRequest, match="invalid request: unknown device 'GPU-x' for"):
        validate_allocate(res, ["GPU-x"])
    with pytest.raises(InvalidRequest, match="listed more than once"):
        validate_allocate(res, [rid, rid])
    with pytest.raises(InvalidRequest, match=r"empty container request for nvidia\.com/gpu"):
        validate_allocate(res, [])


@pytest.mark.parametrize(("strategy", "block"), [(TIME_SLICING, "timeSlicing"), (MPS, "mps")])
def test_fail_requests_greater_than_one_names_resource_and_fix(strategy: str, block: str) -> None:
    res = _shared(strategy)
    ids = [replica_id(b.gpu_uuid(0), 0), replica_id(b.gpu_uuid(1), 0)]
    with pytest.raises(InvalidRequest) as err:
        validate_allocate(res, ids)
    msg = str(err.value)
    assert 'invalid allocation request for "nvidia.com/gpu"' in msg
    assert "maximum request size for shared resources is 1; found 2" in msg
    assert f"sharing.{block}.failRequestsGreaterThanOne: false" in msg


@given(n=st.integers(0, 7))
def test_one_replica_per_container_always_passes(n: int) -> None:
    res = _shared(MPS)
    assert len(validate_allocate(res, [res.devices[n].id])) == 1


def test_more_than_one_replica_passes_when_the_flag_is_off() -> None:
    res = _shared(fail=False)
    assert len(validate_allocate(res, [d.id for d in res.devices])) == 8


def test_more_than_one_passes_on_an_unshared_resource() -> None:
    """The flag only governs shared resources: whole GPUs of a node whose rule
    names another resource are not limited."""
    rule = ReplicaRule(name="nvidia.com/mig-1g.5gb", replicas=2)
    plan = b.settings(MIG_NONE, rule, fail_requests_greater_than_one=True)
    res = b.only(build_resources(b.snapshot(*b.gpus(2)), plan))
    assert res.fail_requests_greater_than_one
    assert len(validate_allocate(res, [b.gpu_uuid(0), b.gpu_uuid(1)])) == 2


def test_more_than_one_passes_when_no_id_is_a_replica() -> None:
    """On a resource that mixes whole and replicated GPUs, whole GPUs are not limited."""
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=2, devices=("2",))
    plan = b.settings(MIG_NONE, rule, fail_requests_greater_than_one=True)
    res = b.only(build_resources(b.snapshot(*b.gpus(3)), plan))
    assert len(validate_allocate(res, [b.gpu_uuid(0), b.gpu_uuid(1)])) == 2
    with pytest.raises(InvalidRequest, match="maximum request size"):
        validate_allocate(res, [b.gpu_uuid(0), replica_id(b.gpu_uuid(2), 0)])


def test_known_devices_labels_its_errors() -> None:
    res = _shared()
    with pytest.raises(InvalidRequest, match=r"^lookup: unknown device 'x' for nvidia.com/gpu$"):
        known_devices(res, ["x"], "lookup")
