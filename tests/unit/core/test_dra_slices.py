"""core.dra.devices and slices: stable names, NVIDIA's attribute names, one pool split
at the device limit, unhealthy devices withdrawn or tainted."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.dra.devices import (
    MAX_ATTRIBUTES,
    DraOptions,
    build_devices,
    gpu_name,
    pci_bus_id,
    semver,
)
from gpuslice.core.dra.slices import build_slices, published
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import MIG_MIXED, MIG_NONE, MPS, ReplicaRule

from . import builders as b

OPTS = DraOptions()


def devices(snapshot: HardwareSnapshot, *rules: ReplicaRule, mig: str = MIG_NONE, **kw: str):
    return build_devices(snapshot, build_resources(snapshot, b.settings(mig, *rules, **kw)))


def test_names_come_from_the_pci_bus_id_and_survive_a_drained_gpu() -> None:
    both = devices(b.snapshot(b.gpu(0), b.gpu(1)))
    assert [d.name for d in both] == ["gpu-0000-07-00-0", "gpu-0000-08-00-0"]
    # GPU 0 drained: GPU 1 is enumerated first, with index and minor 0, and keeps its name
    moved = dataclasses.replace(b.gpu(1), index=0, minor=0)
    (alone,) = devices(b.snapshot(moved))
    assert alone.name == "gpu-0000-08-00-0"
    assert alone.uuid == b.gpu_uuid(1)


def test_a_gpu_without_a_pci_bus_id_is_named_by_its_uuid() -> None:
    gpu = dataclasses.replace(b.gpu(0), pci_bus_id="")
    assert gpu_name(gpu) == "gpu-00000000-1111-2222-3333-444444444444"


def test_standard_forms_of_bus_ids_and_versions() -> None:
    assert pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_bus_id("garbage") == ""
    assert semver("535.104.05") == "535.104.5"
    assert semver("560.28") == "560.28.0"
    assert semver("r550") == ""


def test_gpu_attributes_are_nvidias_names() -> None:
    one = dataclasses.replace(b.gpu(0, numa_node=1), pcie_root="pci0000:00")
    snap = dataclasses.replace(b.snapshot(one), cuda_driver_version=12040)
    (gpu,) = build_devices(snap, build_resources(snap, b.settings()))
    assert gpu.attributes["type"] == {"string": "gpu"}
    assert gpu.attributes["uuid"] == {"string": b.gpu_uuid(0)}
    assert gpu.attributes["productName"] == {"string": b.A100}
    assert gpu.attributes["cudaComputeCapability"] == {"version": "8.0.0"}
    assert gpu.attributes["driverVersion"] == {"version": "550.54.15"}
    assert gpu.attributes["cudaDriverVersion"] == {"version": "12.4.0"}
    assert gpu.attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}
    assert gpu.attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
    assert gpu.attributes["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert gpu.capacity["memory"] == "40960Mi"
    assert len(gpu.attributes) + len(gpu.capacity) <= 32


def test_mig_devices_name_their_parent_profile_and_instances() -> None:
    snap = b.snapshot(b.gpu(0, profiles=["1g.5gb", "1g.10gb+me"]))
    found = devices(snap, mig=MIG_MIXED)
    names = [d.name for d in found]
    assert names == ["gpu-0000-07-00-0-mig-1g10gbme-2-0", "gpu-0000-07-00-0-mig-1g5gb-1-0"]
    mig = found[1]
    assert mig.attributes["type"] == {"string": "mig"}
    assert mig.attributes["parentUUID"] == {"string": b.gpu_uuid(0)}
    assert mig.attributes["profile"] == {"string": "1g.5gb"}
    assert mig.attributes["productName"] == {"string": b.A100}
    assert mig.capacity["memory"] == "4864Mi"


def test_replicas_are_one_device_shared_with_consumable_shares_when_asked() -> None:
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=4)
    (dev,) = devices(b.snapshot(b.gpu(0)), rule)
    assert dev.shared
    assert dev.replicas == 4
    (plain,) = published([dev], frozenset(), OPTS)
    assert "shares" not in plain["capacity"]
    (shares,) = published([dev], frozenset(), DraOptions(consumable_shares=True))
    assert shares["allowMultipleAllocations"] is True
    assert shares["capacity"]["shares"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
    }
    (mps,) = devices(b.snapshot(b.gpu(0)), rule, strategy=MPS)
    assert mps.attributes["sharing"] == {"string": "mps"}


def test_a_device_never_carries_more_attributes_and_capacities_than_the_api_takes() -> None:
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=4)
    (dev,) = devices(b.snapshot(b.gpu(0)), rule)
    extra = {f"extra{i:02}": {"int": i} for i in range(40)}
    crowded = dataclasses.replace(dev, attributes={**dev.attributes, **extra})
    for opts in (OPTS, DraOptions(consumable_shares=True)):
        (entry,) = published([crowded], frozenset(), opts)
        assert len(entry["attributes"]) + len(entry["capacity"]) == MAX_ATTRIBUTES
        assert entry["capacity"].keys() == published([dev], frozenset(), opts)[0]["capacity"].keys()
        assert entry["attributes"]["uuid"] == dev.attributes["uuid"]  # its own come first
        assert entry["attributes"]["sharing"] == {"string": "time-slicing"}
    (plain,) = published([dev], frozenset(), OPTS)
    assert plain["attributes"] == dict(dev.attributes)  # under the limit: all of them


def test_a_failed_gpu_takes_its_mig_devices_out_or_taints_them() -> None:
    snap = b.snapshot(b.gpu(0, profiles=["1g.5gb"]), b.gpu(1, mig_enabled=False))
    found = devices(snap, mig=MIG_MIXED)
    bad = frozenset({b.gpu_uuid(0)})
    assert [e["name"] for e in published(found, bad, OPTS)] == ["gpu-0000-08-00-0"]
    tainted = published(found, bad, DraOptions(taint_unhealthy=True))
    assert tainted[0]["taints"] == [{"key": "gpu.nvidia.com/unhealthy", "effect": "NoSchedule"}]
    assert "taints" not in tainted[1]


def test_slices_hold_one_pool_split_at_128_or_64_with_taints() -> None:
    entries = [{"name": f"d{i}"} for i in range(200)]
    slices = build_slices(entries, node="n1", opts=OPTS, generation=3)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 72]
    for s in slices:
        assert s["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 2}
        assert s["spec"]["nodeName"] == "n1"
        assert s["spec"]["driver"] == "gpu.nvidia.com"
    assert [s["metadata"]["name"] for s in slices] == ["n1-gpu.nvidia.com-0", "n1-gpu.nvidia.com-1"]
    tainted = [{"name": "t", "taints": []}, *entries[:100]]
    assert [
        len(s["spec"]["devices"]) for s in build_slices(tainted, node="n1", opts=OPTS, generation=1)
    ] == [64, 37]
    (empty,) = build_slices([], node="n1", opts=OPTS, generation=1)
    assert empty["spec"]["devices"] == []


@given(st.lists(st.booleans(), max_size=300))
def test_any_pool_keeps_every_device_once_in_order_within_the_limits(tainted: list[bool]) -> None:
    entries = [{"name": f"d{i:03}", **({"taints": []} if t else {})} for i, t in enumerate(tainted)]
    slices = build_slices(entries, node="n", opts=OPTS, generation=7)
    limit = 64 if any(tainted) else 128
    assert all(len(s["spec"]["devices"]) <= limit for s in slices)
    assert [d for s in slices for d in s["spec"]["devices"]] == entries
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
