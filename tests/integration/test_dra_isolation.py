"""DRA claims tell the memory-isolation service which pod holds how much of which GPU:
from the claim's consumable memory, else NVIDIA's MpsConfig pinned limits, else its share
of a replicated GPU; unprepare takes it back."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import AgentLauncher, remove_dir, short_dir
from dra_harness import DRIVER, DraRig, dra_rig

from gpuslice.adapters.fake import FakeBackend
from gpuslice.core.isolation import Limit
from gpuslice.services.claim_shares import ClaimShares
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.cgroups import CgroupTree, r615_node
from gpuslice.testing.kubelet.dra import DraKubeletStandin

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


async def test_the_agent_limits_a_dra_pods_cgroup_from_its_claim(
    launcher: AgentLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    config = tmp_path / "ts.yaml"
    config.write_text(TS_CONFIG)
    tree = CgroupTree(tmp_path / "cgroup")
    plugin_dir = launcher.plugin_dir
    async with FakeApiServer() as api:
        flags = {
            "dra": "true",
            "node-name": "node-a",
            "kubeconfig": str(write_kubeconfig(Path(plugin_dir), api.url)),
            "dra-plugins-dir": os.path.join(plugin_dir, "plugins"),
            "dra-registry-dir": os.path.join(plugin_dir, "registry"),
            "labels": "false",
            "memory-isolation": "true",
            "cgroup-root": str(tree.root),
        }
        tree.make_root(g.pci_bus_id for g in FakeBackend.from_spec("t4").snapshot().gpus)
        node = r615_node("t4", tmp_path / "node.yaml")
        running = await launcher.start(node, config=config, flags=flags, wait_ready=False)
        dra = DraKubeletStandin(flags["dra-registry-dir"], launcher.cdi_spec_dir)
        try:
            await dra.discover(DRIVER)
            await running.until_ready()
            # slices are published once the kubelet has confirmed the registration
            await api.wait_for(lambda server: bool(server.dra.node_devices("node-a")))
            (device,) = api.dra.node_devices("node-a")
            results = [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device,
                        "consumedCapacity": {"memory": "3Gi"}}]  # fmt: skip
            obj = api.dra.put_claim("ml", "a", results)
            pod = "0b9f1c1e-6f0a-4d5e-9a3b-2c1d0e9f8a7b"
            obj["status"]["reservedFor"] = [{"resource": "pods", "name": "a", "uid": pod}]
            ref = ("ml", obj["metadata"]["uid"], "a")
            assert (await dra.prepare(DRIVER, [ref]))[ref[1]].error == ""
            tree.create_pod(pod)  # the kubelet makes the pod's cgroup after preparing
            isolation = running.node.isolation
            assert isolation is not None
            while pod not in isolation.applied:
                isolation.nudge()
                await asyncio.sleep(0.01)
            gpu = running.devices.snapshot.gpus[0].uuid
            assert dict(isolation.applied[pod].limits) == {gpu: Limit(3 << 30)}
        finally:
            await dra.close()
