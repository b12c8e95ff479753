"""Consumable shares (1.36, DRAConsumableCapacity) against the scheduler's own
accounting (gpuslice.testing.dra_allocator): a GPU the config replicates N times takes
N claims, whether they ask for a share or for GPU memory, and a claim's charge comes back
to the node as the memory it is held to, with its share ID."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, DraRig, dra_rig

from gpuslice.core.dra.devices import DraOptions
from gpuslice.testing.dra_allocator import allocate, charge

GIB = 2**30


def replicas(n: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"      - name: nvidia.com/gpu\n        replicas: {n}\n"
    )


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gsh-")
    yield path
    remove_dir(path)


async def shared_rig(root: str, tmp: Path, n: int) -> Any:
    return dra_rig(root, tmp, hardware="t4x4", config=replicas(n),
                   opts=DraOptions(consumable_shares=True))  # fmt: skip


def test_the_model_follows_the_request_policy_rules() -> None:
    ranged = {"value": "10Gi", "requestPolicy": {
        "default": "1Gi", "validRange": {"min": "1Gi", "max": "8Gi", "step": "512Mi"}}}  # fmt: skip
    assert charge(ranged, None) == GIB  # not asked: the default
    assert charge(ranged, "100Mi") == GIB  # below min: min
    assert charge(ranged, "1300Mi") == GIB + GIB // 2  # between steps: rounded up
    assert charge(ranged, "9Gi") is None  # above max
    valued = {"value": "8", "requestPolicy": {"default": "2", "validValues": ["2", "4"]}}
    assert charge(valued, "3") == 4
    assert charge(valued, "5") is None
    assert charge({"value": "16Gi"}, None) == 16 * GIB  # no policy: the whole capacity


async def test_n_one_share_claims_fit_a_gpu_replicated_n_times(root: str, tmp_path: Path) -> None:
    async with await shared_rig(root, tmp_path, 2) as rig:
        devices = await rig.published(lambda d: len(d) == 4)
        entries = list(devices.values())
        assert all(e["allowMultipleAllocations"] for e in entries)
        assert all("requestPolicy" in c for e in entries for c in e["capacity"].values())
        placed = allocate(entries, [{}] * 9)  # each asks for one GPU, no capacity named
        assert [p is not None for p in placed] == [True] * 8 + [False]
        assert {p[0] for p in placed if p} == set(devices)


async def test_claims_asking_memory_are_charged_by_it(root: str, tmp_path: Path) -> None:
    async with await shared_rig(root, tmp_path, 4) as rig:
        devices = await rig.published(lambda d: len(d) == 4)
        memory = next(iter(devices.values()))["capacity"]["memory"]["value"]
        per_gpu = int(memory.removesuffix("Mi")) // 4096  # 4Gi claims per GPU
        placed = allocate(list(devices.values()), [{"memory": "4Gi"}] * 16)
        assert sum(p is not None for p in placed) == 4 * min(per_gpu, 4)
        first = placed[0]
        assert first is not None
        assert first[1]["memory"] == 4 * GIB
        assert first[1]["shares"] == 1


async def test_the_charge_and_share_id_reach_the_node(root: str, tmp_path: Path) -> None:
    async with await shared_rig(root, tmp_path, 4) as rig:
        devices = await rig.published(lambda d: len(d) == 4)
        name = sorted(devices)[0]
        a = put(rig, "a", name, "share-a", "4Gi")
        b = put(rig, "b", name, "share-b", "2Gi")
        results = await rig.kubelet.prepare(DRIVER, [a, b])
        assert [r.error for r in results.values()] == ["", ""]
        assert results[a[1]].devices[0].share_id == "share-a"
        assert results[b[1]].devices[0].share_id == "share-b"
        held = rig.frontend.driver.prepared
        assert held[a[1]].devices[0].memory_mib == 4096
        assert held[b[1]].devices[0].memory_mib == 2048
        assert rig.checkpoint()["claims"][a[1]]["devices"][0]["memoryMib"] == 4096
        bad = put(rig, "bad", name, "share-c", "lots")
        refused = (await rig.kubelet.prepare(DRIVER, [bad]))[bad[1]]
        assert "consumedCapacity.memory: 'lots' is not a memory quantity" in refused.error


def put(rig: DraRig, claim: str, device: str, share: str, memory: str) -> tuple[str, str, str]:
    consumed = {"memory": memory, "shares": "1"}
    return rig.put_claim(claim, device, shareID=share, consumedCapacity=consumed)
