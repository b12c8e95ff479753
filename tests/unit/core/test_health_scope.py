"""fault_scope / recovery_scope: which physical devices one health event touches."""

from __future__ import annotations

import pytest

from gpuslice.core.devices import HealthEvent
from gpuslice.core.health import DEFAULT_SKIPPED_XIDS
from gpuslice.core.health_scope import (
    GPU_WIDE_XIDS,
    fault_scope,
    find_gpu,
    mig_scope,
    recovery_scope,
)
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import MIG_MIXED, MIG_NONE, ReplicaRule

from . import builders as b

# GPU 0: MIG devices (gi, ci) = (1, 0), (2, 0), (3, 0); GPU 1: no MIG.
SNAP = b.snapshot(b.gpu(0, profiles=["1g.5gb", "1g.5gb", "2g.10gb"]), b.gpu(1))
GPU0, GPU1 = b.gpu_uuid(0), b.gpu_uuid(1)
MIG01, MIG02 = b.mig_uuid(0, 1), b.mig_uuid(0, 2)


def xid(gpu: str, code: int = 79, detail: str = "") -> HealthEvent:
    return HealthEvent(gpu_uuid=gpu, kind="xid", xid=code, detail=detail)


@pytest.mark.parametrize(
    ("detail", "scope"),
    [
        ("gi=2 ci=0", (2, 0)),
        ("ecc=double-bit gi=7 ci=1", (7, 1)),
        ("ci=1 gi=7", (7, 1)),
        ("", None),
        ("ecc=double-bit", None),
        ("gi=2", None),
        ("gi=x ci=0", None),
        ("gi=-1 ci=0", None),
        ("gi=² ci=0", None),
    ],
)
def test_mig_scope_reads_gi_and_ci_tokens(detail: str, scope: tuple[int, int] | None) -> None:
    assert mig_scope(detail) == scope


def test_a_gpu_event_marks_the_gpu_itself() -> None:
    """The GPU UUID covers every replica and MIG device on it (see the handler tests)."""
    assert fault_scope(xid(GPU0), SNAP) == {GPU0}
    assert fault_scope(xid(GPU1, 48, "ecc=double-bit"), SNAP) == {GPU1}


def test_a_mig_scoped_event_marks_only_the_mig_device_with_that_gi_and_ci() -> None:
    """Application-level and contained faults stay on their instance, as upstream."""
    assert fault_scope(xid(GPU0, 31, "gi=2 ci=0"), SNAP) == {MIG01}
    assert fault_scope(xid(GPU0, 43, "gi=2 ci=0"), SNAP) == {MIG01}
    assert fault_scope(xid(GPU0, 94, "ecc=contained gi=3 ci=0"), SNAP) == {MIG02}


@pytest.mark.parametrize("code", sorted(GPU_WIDE_XIDS))
def test_a_gpu_wide_xid_marks_the_whole_gpu_whatever_instance_it_names(code: int) -> None:
    """Off the bus, uncontained ECC, GSP and the other fatal XIDs take every MIG device
    and replica of the GPU with them, even when the event names one instance."""
    assert fault_scope(xid(GPU0, code, "gi=2 ci=0"), SNAP) == {GPU0}
    assert fault_scope(xid(GPU0, code, "gi=9 ci=0"), SNAP) == {GPU0}
    assert fault_scope(xid(MIG02, code), SNAP) == {GPU0}


def test_a_gpu_wide_xid_covers_every_advertised_device_of_the_gpu() -> None:
    rules = (ReplicaRule("nvidia.com/mig-1g.5gb", 3), ReplicaRule("nvidia.com/gpu", 2))
    resources = build_resources(SNAP, b.settings(MIG_MIXED, *rules))
    served = {d.physical_id for r in resources for d in r.devices}
    marked = fault_scope(xid(GPU0, 79, "gi=2 ci=0"), SNAP, served)
    hit = {d.id for r in resources for d in r.devices if {d.gpu_uuid, d.physical_id} & marked}
    on_gpu0 = {d.id for r in resources for d in r.devices if d.gpu_uuid == GPU0}
    assert hit == on_gpu0
    assert len(on_gpu0) == 2 * 3 + 1  # two 1g.5gb devices x 3 replicas, one 2g.10gb


def test_the_gpu_wide_set_is_the_fatal_list_and_can_be_narrowed() -> None:
    assert {48, 62, 64, 74, 79, 92, 95, 119, 120, 140} <= GPU_WIDE_XIDS
    assert not DEFAULT_SKIPPED_XIDS & GPU_WIDE_XIDS
    assert fault_scope(xid(GPU0, 79, "gi=2 ci=0"), SNAP, gpu_wide=()) == {MIG01}


def test_a_mig_scoped_event_for_an_unknown_instance_marks_nothing() -> None:
    assert fault_scope(xid(GPU0, 31, "gi=9 ci=0"), SNAP) == frozenset()
    assert fault_scope(xid(GPU0, 31, "gi=2 ci=5"), SNAP) == frozenset()


def test_instance_ids_on_a_gpu_without_mig_devices_mark_the_whole_gpu() -> None:
    assert fault_scope(xid(GPU1, 31, "gi=1 ci=0"), SNAP) == {GPU1}


def test_a_mig_scoped_event_on_a_gpu_served_whole_marks_the_gpu() -> None:
    """MIG strategy none serves a MIG-enabled GPU whole: its MIG devices are not
    advertised, so the fault lands on the GPU, as upstream's lookup does."""
    resources = build_resources(SNAP, b.settings(MIG_NONE))
    served = {d.physical_id for r in resources for d in r.devices}
    assert fault_scope(xid(GPU0, 31, "gi=2 ci=0"), SNAP, served) == {GPU0}
    mixed = build_resources(SNAP, b.settings(MIG_MIXED))
    served = {d.physical_id for r in mixed for d in r.devices}
    assert fault_scope(xid(GPU0, 31, "gi=2 ci=0"), SNAP, served) == {MIG01}


def test_an_event_without_a_gpu_marks_every_gpu() -> None:
    assert fault_scope(xid(""), SNAP) == {GPU0, GPU1}
    assert fault_scope(HealthEvent("", "lost"), SNAP) == {GPU0, GPU1}


def test_an_event_for_a_gpu_not_on_the_node_marks_nothing() -> None:
    assert fault_scope(xid(b.gpu_uuid(7)), SNAP) == frozenset()


def test_lost_marks_the_gpu_and_ignores_instance_ids() -> None:
    assert fault_scope(HealthEvent(GPU0, "lost", detail="gi=2 ci=0"), SNAP) == {GPU0}


def test_an_event_naming_a_mig_device_marks_that_device() -> None:
    assert fault_scope(xid(MIG02, 94), SNAP) == {MIG02}
    assert find_gpu(SNAP, MIG02) == SNAP.gpus[0]


def test_recovered_covers_the_gpu_and_its_mig_devices() -> None:
    back = recovery_scope(HealthEvent(GPU0, "recovered"), SNAP)
    assert back == {GPU0, b.mig_uuid(0, 0), MIG01, MIG02}
    assert recovery_scope(HealthEvent(MIG01, "recovered"), SNAP) == {MIG01}
    assert recovery_scope(HealthEvent("", "recovered"), SNAP) == frozenset()


def test_replicated_resources_keep_gpu_and_physical_ids_for_health() -> None:
    """Every replica carries its GPU's UUID and its MIG UUID, which health matches."""
    rule = ReplicaRule(name="nvidia.com/mig-1g.5gb", replicas=3)
    resources = b.by_name(build_resources(SNAP, b.settings(MIG_MIXED, rule)))
    replicas = resources["nvidia.com/mig-1g.5gb"].devices
    assert len(replicas) == 6
    assert {d.physical_id for d in replicas} == {b.mig_uuid(0, 0), MIG01}
    assert {d.gpu_uuid for d in replicas} == {GPU0}
