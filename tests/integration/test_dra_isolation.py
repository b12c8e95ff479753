"""DRA claims tell the memory-isolation service which pod holds how much of which GPU:
from the claim's consumable memory, else NVIDIA's MpsConfig pinned limits, else its share
of a replicated GPU; unprepare takes it back."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import cast

import pytest
from agent_harness import AgentLauncher, RunningAgent, remove_dir, short_dir
from conftest import Logged
from dra_harness import DRIVER, DraRig, dra_rig
from faults_harness import eventually

from gpuslice.adapters.cgroup_tree import PodCgroupTree
from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.adapters.podresources import read_checkpoint
from gpuslice.core.isolation import Limit
from gpuslice.core.ports import GpuBackend
from gpuslice.services.claim_shares import ClaimShares
from gpuslice.services.isolation import Isolation
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.cgroups import CgroupTree, r615_node
from gpuslice.testing.kubelet.dra import DraKubeletStandin
from gpuslice.wiring.agent import Parts

GPU0 = "gpu-0000-07-00-0"  # dgx-a100's first GPU (A100-SXM4-40GB)
A100_MIB = 40960
POD_A = "0b9f1c1e-6f0a-4d5e-9a3b-2c1d0e9f8a7b"
POD_B = "5d2e7a40-1c3b-4f8e-b6a9-0e1f2d3c4b5a"
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


def isolation_flags(plugin_dir: str, api: FakeApiServer, tree: CgroupTree) -> dict[str, str]:
    """DRA with memory isolation on node-a, its cgroup tree rooted for the T4's dmem."""
    tree.make_root(g.pci_bus_id for g in FakeBackend.from_spec("t4").snapshot().gpus)
    return {
        "dra": "true",
        "node-name": "node-a",
        "kubeconfig": str(write_kubeconfig(Path(plugin_dir), api.url)),
        "dra-plugins-dir": os.path.join(plugin_dir, "plugins"),
        "dra-registry-dir": os.path.join(plugin_dir, "registry"),
        "labels": "false",
        "memory-isolation": "true",
        "cgroup-root": str(tree.root),
    }


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
        flags = isolation_flags(plugin_dir, api, tree)
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


async def test_a_restarted_agent_keeps_its_dra_pods_limits_and_never_clears_them(
    root: str, tmp_path: Path, logged: Logged
) -> None:
    """A new front-end and a new isolation service over the same checkpoint directory,
    simulated driver (its limits) and cgroup tree: the running pod's limit stays as it
    was (neither cleared nor set again), and a pod whose claim was prepared before the
    restart gets its limit when its cgroup appears after it."""
    hardware = r615_node("t4", tmp_path / "node.yaml")
    tree = CgroupTree(tmp_path / "cgroup")
    kubelet_checkpoint = str(tmp_path / "kubelet_internal_checkpoint")  # no device-plugin pods
    async with dra_rig(root, tmp_path, hardware=hardware, config=TS_CONFIG,
                       flags={"memory-isolation": "true"}) as rig:  # fmt: skip
        devices = rig.health.devices
        tree.make_root(g.pci_bus_id for g in devices.snapshot.gpus)

        def isolation() -> Isolation:  # what an agent's start builds over the node
            cgroups = PodCgroupTree(tree.root)
            return Isolation(devices, cgroups, lambda: read_checkpoint(kubelet_checkpoint),
                             DirWatcher, claims=rig.shares)  # fmt: skip

        rig.frontend.driver.shares = rig.shares = ClaimShares()
        (device,) = await rig.published(bool)
        a = rig.put_claim("a", device, consumedCapacity={"memory": "3Gi"})
        b = rig.put_claim("b", device, consumedCapacity={"memory": "2Gi"})
        reserve(rig, "a", POD_A)
        reserve(rig, "b", POD_B)
        results = await rig.kubelet.prepare(DRIVER, [a, b])
        assert [r.error for r in results.values()] == ["", ""]
        tree.create_pod(POD_A)
        before = isolation()
        await before.converge()
        gpu = rig.gpu(0)
        assert dict(before.applied[POD_A].limits) == {gpu: Limit(3 << 30)}

        await rig.stop()  # the agent restarts (or its successor starts)
        rig.shares = ClaimShares()
        await rig.start()
        since = len(logged)
        tree.create_pod(POD_B)  # made by the kubelet while the agent restarted
        after = isolation()
        await after.converge()

        def in_force(pod: str) -> Callable[[GpuBackend], int]:
            """The hard limit the simulated driver holds for the pod's cgroup."""
            cgroup = "/sys/fs/cgroup/" + str(tree.pod_dir(pod).relative_to(tree.root))
            return lambda backend: cast(FakeBackend, backend).memory_limit(gpu, cgroup).hard

        assert dict(after.applied[POD_A].limits) == {gpu: Limit(3 << 30)}
        assert await devices.on_backend(in_force(POD_A)) == 3 << 30
        assert dict(after.applied[POD_B].limits) == {gpu: Limit(2 << 30)}
        assert await devices.on_backend(in_force(POD_B)) == 2 << 30
        touched = [(e["event"], e.get("pod_uid")) for e in logged[since:]
                   if str(e["event"]).startswith("memory_limit")]  # fmt: skip
        assert touched == [("memory_limit_set", POD_B)]  # pod-a's was never cleared


async def test_a_successor_takes_over_the_claims_its_predecessor_prepared_until_it_let_go(
    rig: DraRig,
) -> None:
    """A rolling update: the successor reads the checkpoint at start, while its predecessor
    still serves and prepares; once the predecessor lets go of the sockets the successor
    reads it again, so a claim prepared in between is known, its pods' limits with it."""
    assert rig.shares is None
    rig.shares = rig.frontend.driver.shares
    a = rig.put_claim("a", GPU0, consumedCapacity={"memory": "2Gi"})
    reserve(rig, "a", POD_A)
    assert (await rig.kubelet.prepare(DRIVER, [a]))[a[1]].error == ""
    predecessor, its_client = rig.task, rig.client
    rig.task = rig.client = None
    rig.shares = successor_shares = ClaimShares()
    await rig.start()  # the successor: its sockets wait for the predecessor's
    await rig.frontend.blocked.wait()
    assert set(successor_shares.by_pod()) == {POD_A}  # known before its first isolation pass
    b = rig.put_claim("b", GPU0, consumedCapacity={"memory": "1Gi"})
    reserve(rig, "b", POD_B)
    assert (await rig.kubelet.prepare(DRIVER, [b]))[b[1]].error == ""  # the predecessor's
    assert predecessor is not None
    assert its_client is not None
    predecessor.cancel()  # it lets go
    with contextlib.suppress(asyncio.CancelledError):
        await predecessor
    await its_client.close()
    await rig.frontend.driver.settled.wait()
    assert set(rig.frontend.driver.prepared) == {a[1], b[1]}
    assert successor_shares.by_pod() == {
        POD_A: {rig.gpu(0): Limit(2 << 30)},
        POD_B: {rig.gpu(0): Limit(1 << 30)},
    }
    await rig.kubelet.discover(DRIVER)
    assert await rig.kubelet.unprepare(DRIVER, [a, b]) == {a[1]: "", b[1]: ""}
    assert rig.spec_files() == []


async def test_a_restarted_agent_keeps_the_limits_of_its_dra_pods(
    launcher: AgentLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: Logged
) -> None:
    """The whole agent stopped and a new one started over the same plugin directories,
    cgroup tree and simulated driver (whose limits, as a real driver's, outlive the
    agent): the running pod's limit is never cleared, and the pod whose cgroup the
    kubelet made meanwhile is limited from its claim, prepared before the restart."""
    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    config = tmp_path / "ts.yaml"
    config.write_text(TS_CONFIG)
    tree = CgroupTree(tmp_path / "cgroup")
    plugin_dir = launcher.plugin_dir
    driver_state: list[GpuBackend] = []

    def same_driver(deps: Parts) -> Parts:
        def open_backend() -> GpuBackend:
            if not driver_state:
                driver_state.append(deps.open_backend())
            return driver_state[0]

        return dataclasses.replace(deps, open_backend=open_backend)

    async with FakeApiServer() as api:
        flags = isolation_flags(plugin_dir, api, tree)
        node = r615_node("t4", tmp_path / "node.yaml")
        first = await launcher.start(node, config=config, flags=flags, change=same_driver)
        dra = DraKubeletStandin(flags["dra-registry-dir"], launcher.cdi_spec_dir)
        try:
            await dra.discover(DRIVER)
            await api.wait_for(lambda server: bool(server.dra.node_devices("node-a")))
            (device,) = api.dra.node_devices("node-a")
            refs = []
            for name, pod, memory in (("a", POD_A, "3Gi"), ("b", POD_B, "1Gi")):
                results = [{"request": "gpu", "driver": DRIVER, "pool": "node-a",
                            "device": device, "consumedCapacity": {"memory": memory}}]  # fmt: skip
                obj = api.dra.put_claim("ml", name, results)
                obj["status"]["reservedFor"] = [{"resource": "pods", "name": name, "uid": pod}]
                refs.append(("ml", obj["metadata"]["uid"], name))
            answers = await dra.prepare(DRIVER, refs)
            assert [r.error for r in answers.values()] == ["", ""]
            tree.create_pod(POD_A)
            gpu = first.devices.snapshot.gpus[0].uuid
            await until_limited(first, POD_A)
            since = len(logged)
            await first.shutdown()  # the agent restarts
            tree.create_pod(POD_B)  # the kubelet goes on meanwhile
            second = await launcher.start(node, config=config, flags=flags, change=same_driver)
            await until_limited(second, POD_B)
            isolation = second.node.isolation
            assert isolation is not None
            assert dict(isolation.applied[POD_A].limits) == {gpu: Limit(3 << 30)}
            assert dict(isolation.applied[POD_B].limits) == {gpu: Limit(1 << 30)}
            touched = [(e["event"], e["pod_uid"]) for e in logged[since:]
                       if str(e["event"]).startswith("memory_limit")]  # fmt: skip
            assert touched == [("memory_limit_set", POD_B)]  # POD_A's: never cleared
        finally:
            await dra.close()


async def until_limited(running: RunningAgent, pod: str) -> None:
    isolation = running.node.isolation
    assert isolation is not None
    await eventually(lambda: bool(pod in isolation.applied and isolation.applied[pod].limits),
                     f"pod {pod} limited", timeout_s=30)  # fmt: skip
