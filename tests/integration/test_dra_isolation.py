"""DRA claims tell the memory-isolation service which pod holds how much of which GPU:
from the claim's consumable memory, else NVIDIA's MpsConfig pinned limits, else its share
of a replicated GPU; unprepare takes it back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, DraRig, dra_rig

from gpuslice.core.isolation import Limit
from gpuslice.services.isolation import ClaimShares

GPU0 = "gpu-0000-07-00-0"  # dgx-a100's first GPU (A100-SXM4-40GB)
A100_MIB = 40960
TS_CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gsi-")
    yield path
    remove_dir(path)


@pytest.fixture
async def rig(root: str, tmp_path: Path) -> AsyncIterator[DraRig]:
    flags = {"memory-isolation": "true"}
    async with dra_rig(root, tmp_path, config=TS_CONFIG, flags=flags) as running:
        running.frontend.driver.shares = ClaimShares()
        await running.kubelet.discover(DRIVER)
        await running.published(lambda d: GPU0 in d)
        yield running


def reserve(rig: DraRig, name: str, pod_uid: str) -> None:
    claim = rig.api.dra.claims[("ml", name)]
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": name, "uid": pod_uid}]


async def test_a_claims_consumed_memory_becomes_its_pods_limit_until_unprepared(
    rig: DraRig,
) -> None:
    shares = rig.frontend.driver.shares
    assert shares is not None
    a = rig.put_claim("a", GPU0, consumedCapacity={"memory": "2Gi"})
    b = rig.put_claim("b", GPU0)
    reserve(rig, "a", "pod-a")
    reserve(rig, "b", "pod-b")
    results = await rig.kubelet.prepare(DRIVER, [a, b])
    assert [r.error for r in results.values()] == ["", ""]
    gpu = rig.gpu(0)
    assert shares.by_pod() == {
        "pod-a": {gpu: Limit(2 << 30)},
        "pod-b": {gpu: Limit(A100_MIB * (1 << 20) // 4)},  # its replica's share
    }
    assert await rig.kubelet.unprepare(DRIVER, [a]) == {a[1]: ""}
    assert set(shares.by_pod()) == {"pod-b"}


async def test_a_claim_of_a_whole_unshared_gpu_carries_no_limit(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path, flags={"memory-isolation": "true"}) as rig:
        rig.frontend.driver.shares = shares = ClaimShares()
        await rig.kubelet.discover(DRIVER)
        await rig.published(lambda d: GPU0 in d)
        a = rig.put_claim("a", GPU0)
        reserve(rig, "a", "pod-a")
        assert (await rig.kubelet.prepare(DRIVER, [a]))[a[1]].error == ""
        assert shares.by_pod() == {"pod-a": {}}
