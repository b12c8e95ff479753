"""Per-pod GPU memory limits on the whole agent: pods admitted through the kubelet stand-in
(its device checkpoint), pod cgroups made in a directory tree of the host's shape under
either cgroup driver, limits set on the simulated driver, and a simulated process refused
past its pod's hard limit while its neighbour on the same GPU keeps allocating."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from agent_harness import EXAMPLES, AgentLauncher, RunningAgent
from conftest import Logged
from process_harness import run_once

from gpuslice.adapters.cgroup_tree import PodCgroupTree
from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.adapters.podresources import PodResourcesClient, read_checkpoint
from gpuslice.core.isolation import DMEM, LABEL, Limit
from gpuslice.services.isolation import Isolation
from gpuslice.services.sampler import Sampler, SampleSources
from gpuslice.testing.cgroups import CGROUPFS, SYSTEMD, CgroupTree, r615_node
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.agent import Parts

GPU = "nvidia.com/gpu"
MIB = 1 << 20
T4_MIB = 15360
SHARE = T4_MIB * MIB // 4  # the t4 profile's GPU, time-sliced 4 ways


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    pod_resources = os.path.join(plugin_dir, "pr", "kubelet.sock")
    async with KubeletStandin(plugin_dir, pod_resources) as standin:
        yield standin


class Isolated:
    def __init__(self, running: RunningAgent, backend: FakeBackend, tree: CgroupTree) -> None:
        self.running, self.backend, self.tree = running, backend, tree
        assert running.node.isolation is not None
        self.isolation: Isolation = running.node.isolation

    async def until(self, check: Callable[[], bool]) -> None:
        while not check():
            self.isolation.nudge()
            await asyncio.sleep(0.01)

    def line(self, data: object) -> None:
        with open(self.running.events_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(data) + "\n")

    def host_path(self, uid: str) -> str:
        return "/sys/fs/cgroup/" + str(self.tree.pod_dir(uid).relative_to(self.tree.root))


async def start(
    launcher: AgentLauncher,
    kubelet: KubeletStandin,
    root: Path,
    driver: str,
    kubelet_root: str = "",  # the kubelet's --cgroup-root: its kubepods is made first
    **flags: str,
) -> Isolated:
    opened: list[FakeBackend] = []

    def keep(deps: Parts) -> Parts:
        def open_backend() -> FakeBackend:
            backend = deps.open_backend()
            assert isinstance(backend, FakeBackend)
            opened.append(backend)
            return backend

        return dataclasses.replace(deps, open_backend=open_backend)

    tree = CgroupTree(root, driver, kubelet_root or "/")
    if kubelet_root:
        tree.make_kubepods()
    running = await launcher.start(
        r615_node("t4", root.parent / "node.yaml"),
        config=flags.pop("config", str(EXAMPLES / "time-slicing.yaml")),
        flags={"memory-isolation": "true", "cgroup-root": str(root), **flags},
        change=keep,
    )
    tree.make_root(g.pci_bus_id for g in running.devices.snapshot.gpus)
    await running.registered(kubelet)
    return Isolated(running, opened[0], tree)


@pytest.mark.parametrize("driver", [SYSTEMD, CGROUPFS])
async def test_a_pod_is_stopped_at_its_limit_while_its_neighbour_keeps_allocating(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path, driver: str
) -> None:
    node = await start(launcher, kubelet, tmp_path / "cgroup", driver)
    a = (await kubelet.admit("a", {"main": {GPU: 1}}))[0]
    b = (await kubelet.admit("b", {"main": {GPU: 1}}))[0]
    gpu = a.device_ids[0].split("::")[0]
    assert b.device_ids[0].startswith(gpu)  # one GPU: neighbours
    for pod in (a, b):
        node.tree.create_pod(pod.pod_uid)
    await node.until(lambda: len(node.isolation.applied) == 2)

    for pod in (a, b):
        reading = node.backend.memory_limit(gpu, node.host_path(pod.pod_uid))
        assert (reading.hard, reading.soft) == (SHARE, 0)
    assert node.isolation.gpus[0].mode == DMEM
    assert node.isolation.labels() == {LABEL: DMEM}
    node.line({"process": {"pid": 11, "gpu": gpu, "memory_mib": 3000, "pod_uid": a.pod_uid}})
    node.line({"process": {"pid": 12, "gpu": gpu, "memory_mib": 3000, "pod_uid": b.pod_uid}})
    node.line({"allocate": {"pid": 11, "memory_mib": 1000}})  # 4000 MiB > 3840: refused
    node.line({"allocate": {"pid": 12, "memory_mib": 800}})  # 3800 MiB: fits
    refused = node.backend.refused
    assert len(refused) == 1
    assert "process 11" in refused[0]
    assert node.backend.memory_limit(gpu, node.host_path(a.pod_uid)).used == 3000 * MIB
    assert node.backend.memory_limit(gpu, node.host_path(b.pod_uid)).used == 3800 * MIB


async def test_limits_go_with_the_pod_and_are_rebuilt_after_a_restart(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path, logged: Logged
) -> None:
    node = await start(launcher, kubelet, tmp_path / "cgroup", SYSTEMD)
    a = (await kubelet.admit("a", {"main": {GPU: 2}}))[0]
    node.tree.create_pod(a.pod_uid)
    await node.until(lambda: a.pod_uid in node.isolation.applied)
    limits = dict(node.isolation.applied[a.pod_uid].limits)
    assert limits == {a.device_ids[0].split("::")[0]: Limit(2 * SHARE)}  # two replicas

    b = (await kubelet.admit("b", {"main": {GPU: 1}}))[0]
    node.tree.create_pod(b.pod_uid)
    await node.until(lambda: b.pod_uid in node.isolation.applied)
    gpu = b.device_ids[0].split("::")[0]
    node.backend.set_memory_limit(gpu, node.host_path(b.pod_uid), Limit(1 << 30))  # not its share

    # The agent restarts: a new service over the same driver state and the kubelet's records
    # keeps what matches them (never cleared in between) and corrects what does not.
    since = len(logged)
    fresh = Isolation(
        node.running.devices,
        PodCgroupTree(node.tree.root),
        lambda: read_checkpoint(kubelet.checkpoint_path),
        DirWatcher,
    )
    await fresh.converge()
    assert [e for e in logged[since:] if e.get("pod_uid") == a.pod_uid] == []  # a's untouched
    assert fresh.applied[a.pod_uid].limits == limits
    assert fresh.applied[b.pod_uid].limits == {gpu: Limit(SHARE)}
    assert node.backend.memory_limit(gpu, node.host_path(b.pod_uid)).hard == SHARE

    node.tree.remove_pod(a.pod_uid)  # the pod ends: its cgroup, and the limits, go
    await node.until(lambda: a.pod_uid not in node.isolation.applied)
    await kubelet.release("a")


async def test_a_resource_turned_off_gets_no_limit_and_the_readiness_says_why_not_dmem(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    config = tmp_path / "off.yaml"
    config.write_text(
        (EXAMPLES / "time-slicing.yaml").read_text()
        + 'memoryIsolation:\n  resources:\n    nvidia.com/gpu:\n      hardLimit: "off"\n'
    )
    node = await start(launcher, kubelet, tmp_path / "cgroup", CGROUPFS, config=str(config))
    (tmp_path / "cgroup" / "dmem.capacity").unlink()
    (tmp_path / "cgroup" / "cgroup.controllers").write_text("cpu memory pids\n")
    a = (await kubelet.admit("a", {"main": {GPU: 1}}))[0]
    node.tree.create_pod(a.pod_uid)
    passes = node.isolation.passes
    await node.until(lambda: node.isolation.passes > passes + 1)
    assert (
        not node.isolation.applied.get(a.pod_uid, None)
        or not node.isolation.applied[a.pod_uid].limits
    )
    _ready, details = node.running.node.readiness()
    detail = details["memoryIsolation"]
    assert detail["mode"] == "driver"
    assert "no dmem cgroup controller" in detail["missing"]


async def test_a_hard_limit_over_the_gpu_is_refused_like_any_config_in_one_line(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    base = (EXAMPLES / "time-slicing.yaml").read_text()
    config.write_text(base)
    node = await start(launcher, kubelet, tmp_path / "cgroup", SYSTEMD, config=str(config))
    config.write_text(
        base + "memoryIsolation:\n  resources:\n    nvidia.com/gpu:\n      hardLimit: 8Gi\n"
    )
    assert not await node.running.reload()
    rejected = node.running.rejected or ""
    assert "4 replicas x 8192 MiB is more than GPU 0's 15360 MiB" in rejected
    assert "allowOvercommit" in rejected
    assert "\n" not in rejected
    config.write_text(
        base + "memoryIsolation:\n  allowOvercommit: true\n"
        "  resources:\n    nvidia.com/gpu:\n      hardLimit: 8Gi\n      softLimit: 1Gi\n"
    )
    assert await node.running.reload()
    a = (await kubelet.admit("a", {"main": {GPU: 1}}))[0]
    node.tree.create_pod(a.pod_uid)
    await node.until(lambda: a.pod_uid in node.isolation.applied)
    gpu = a.device_ids[0].split("::")[0]
    assert dict(node.isolation.applied[a.pod_uid].limits) == {gpu: Limit(8 << 30, 1 << 30)}
    off = 'memoryIsolation:\n  resources:\n    nvidia.com/gpu:\n      hardLimit: "off"\n'
    config.write_text(base + off)  # a running pod's limit follows the config
    assert await node.running.reload()
    await node.until(lambda: not node.isolation.applied[a.pod_uid].limits)
    assert not node.backend.memory_limit(gpu, node.host_path(a.pod_uid)).limited


def test_inspect_shows_each_gpus_memory_isolation_and_what_is_missing(tmp_path: Path) -> None:
    tree = CgroupTree(tmp_path / "cgroup")
    tree.make_root(g.pci_bus_id for g in FakeBackend.from_spec("t4").snapshot().gpus)
    node = r615_node("t4", tmp_path / "node.yaml")
    args = ("inspect", "--fake-hardware", node, "--cgroup-root", str(tree.root))
    result = run_once(*args, "--output", "json")
    assert result.returncode == 0, result.stderr
    (gpu,) = json.loads(result.stdout)["gpus"]
    assert gpu["memoryIsolation"] == {"mode": DMEM, "missing": "", "enabled": False}
    old = run_once("inspect", "--fake-hardware", "t4", "--cgroup-root", str(tree.root))
    assert "memory isolation: driver 535.183.01 is older than r615" in old.stdout
    (tree.root / "cgroup.controllers").unlink()
    table = run_once(*args)
    assert table.returncode == 0, table.stderr
    assert "MEMORY ISOLATION" in table.stdout
    assert "memory isolation: cgroup v2 is not mounted (cgroup v1 or none)" in table.stdout


@pytest.mark.parametrize(
    ("cgroup", "mode", "said"),
    [
        ("", DMEM, ""),  # by default a current node: cgroup v2 with dmem over every GPU
        ("cgroup: {version: 1}\n", "none", "cgroup v2 is not mounted"),
    ],
)
def test_inspect_on_a_simulated_node_describes_that_node_not_this_machine(
    tmp_path: Path, cgroup: str, mode: str, said: str
) -> None:
    node = Path(r615_node("t4", tmp_path / "node.yaml"))
    node.write_text(node.read_text() + cgroup)
    args = ("inspect", "--fake-hardware", str(node), "--memory-isolation")
    report = json.loads(run_once(*args, "--output", "json").stdout)
    where = f"the simulated node {node} (its node file's cgroup facts)"
    assert report["memoryIsolation"]["cgroups"] == where
    (gpu,) = report["gpus"]
    assert gpu["memoryIsolation"]["mode"] == mode
    assert said in gpu["memoryIsolation"]["missing"]
    assert "models no pod cgroups" in report["memoryIsolation"]["podCgroups"]
    table = run_once(*args).stdout
    assert f"memory isolation facts: {where}" in table


async def test_accounting_reads_a_limited_pods_memory_from_the_limit(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    node = await start(launcher, kubelet, tmp_path / "cgroup", SYSTEMD)
    a = (await kubelet.admit("a", {"main": {GPU: 1}}))[0]
    node.tree.create_pod(a.pod_uid)
    await node.until(lambda: a.pod_uid in node.isolation.applied)
    gpu = a.device_ids[0].split("::")[0]
    node.line({"process": {"pid": 21, "gpu": gpu, "memory_mib": 2000, "pod_uid": a.pod_uid}})
    assert kubelet.pod_resources_socket is not None
    pods = PodResourcesClient(kubelet.pod_resources_socket, kubelet.checkpoint_path)
    devices = node.running.devices
    sources = SampleSources(
        devices.on_backend,
        lambda: devices.snapshot,
        pods,
        node.backend,
        cgroup_used=node.isolation.usage,
    )
    sampler = Sampler(sources)
    try:
        got = await sampler.sample_once()
    finally:
        await pods.aclose()
    assert got is not None, sampler.error
    (usage,) = got.containers
    assert (usage.memory_source, usage.memory_used_bytes) == ("cgroup", 2000 * MIB)


async def test_a_limit_the_driver_refuses_is_reported_and_set_once_it_can_be(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    node = await start(launcher, kubelet, tmp_path / "cgroup", SYSTEMD)
    a = (await kubelet.admit("a", {"main": {GPU: 1}}))[0]
    node.line({"gpu": 0, "lost": True})  # NVML answers GPU_IS_LOST for it now
    node.tree.create_pod(a.pod_uid)
    await node.until(lambda: node.isolation.error is not None)
    _, details = node.running.node.readiness()
    assert "GPU is lost" in details["memoryIsolation"]["error"]
    assert a.pod_uid not in node.isolation.in_force_at
    node.line({"gpu": 0, "recovered": True})
    await node.until(lambda: a.pod_uid in node.isolation.in_force_at)
    assert node.isolation.error is None


@pytest.mark.parametrize("driver", [SYSTEMD, CGROUPFS])
@pytest.mark.parametrize("kubelet_root", ["/kubelet", "/k8s/node-a"], ids=["kind", "custom"])
async def test_a_pod_below_a_kubelets_custom_cgroup_root_gets_its_limit(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path, driver: str, kubelet_root: str
) -> None:
    """kind's kubelet (--cgroup-root=/kubelet: kubelet.slice/kubelet-kubepods.slice/...
    under systemd) and a deeper custom root: the pod's cgroup is found and limited."""
    node = await start(launcher, kubelet, tmp_path / "cgroup", driver, kubelet_root)
    a = (await kubelet.admit("a", {"main": {GPU: 1}}))[0]
    node.tree.create_pod(a.pod_uid)
    await node.until(lambda: bool(node.isolation.applied.get(a.pod_uid, None)))
    gpu = a.device_ids[0].split("::")[0]
    reading = node.backend.memory_limit(gpu, node.host_path(a.pod_uid))
    assert (reading.hard, reading.soft) == (SHARE, 0)
    assert node.isolation.enforced() == {gpu}
    detail = node.running.node.readiness()[1]["memoryIsolation"]
    kubepods = str(node.tree.make_kubepods().relative_to(node.tree.root))
    assert detail["kubepods"] == [f"/sys/fs/cgroup/{kubepods}"]
    assert "podCgroups" not in detail


async def test_without_a_kubepods_cgroup_readiness_and_inspect_say_why_nothing_is_limited(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    node = await start(launcher, kubelet, tmp_path / "cgroup", SYSTEMD)
    (tmp_path / "cgroup" / "system.slice" / "containerd.service").mkdir(parents=True)
    passes = node.isolation.passes
    await node.until(lambda: node.isolation.passes > passes)
    detail = node.running.node.readiness()[1]["memoryIsolation"]
    said = (
        "no kubepods cgroup (kubepods, kubepods.slice or <prefix>-kubepods.slice) "
        f"under {tmp_path / 'cgroup'}, searched 3 levels deep without following links"
    )  # the root, system.slice, containerd.service
    assert said in detail["podCgroups"]
    assert "\n" not in detail["podCgroups"]
    assert detail["mode"] == DMEM  # the node could: only the pods' cgroups are missing
    assert node.isolation.enforced() == frozenset()  # the watchdog does not stand down

    args = ["inspect", "--fake-hardware", node.running.opts.fake_hardware or ""]
    args += ["--memory-isolation", "--cgroup-root", str(tmp_path / "cgroup")]
    args += ["--config-file", str(EXAMPLES / "time-slicing.yaml")]
    table = run_once(*args).stdout
    (line,) = [x for x in table.splitlines() if x.startswith("memory isolation: ")]
    assert line.startswith(f"memory isolation: {said}")
    assert f"memory isolation facts: this machine's cgroup tree at {tmp_path}" in table
    report = json.loads(run_once(*args, "--output", "json").stdout)
    assert report["memoryIsolation"]["podCgroups"] == detail["podCgroups"]
    assert {s["hardLimitBytes"] for g in report["gpus"] for s in g["servedAs"]} == {None}


async def test_a_restarted_agent_keeps_its_device_plugin_pods_limits(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path, logged: Logged
) -> None:
    """The whole agent stopped and a new one started over the same kubelet (its device
    checkpoint, which the PodResources holds come from), cgroup tree and simulated driver
    (whose limits, as a real driver's, outlive the agent): the pod's limit is neither
    cleared nor set again."""
    node = await start(launcher, kubelet, tmp_path / "cgroup", SYSTEMD)
    a = (await kubelet.admit("a", {"main": {GPU: 2}}))[0]
    node.tree.create_pod(a.pod_uid)
    await node.until(lambda: bool(node.isolation.applied.get(a.pod_uid, None)))
    gpu = a.device_ids[0].split("::")[0]
    since = len(logged)
    await node.running.shutdown()  # the agent restarts

    def same_driver(deps: Parts) -> Parts:
        return dataclasses.replace(deps, open_backend=lambda: node.backend)

    second = await launcher.start(
        r615_node("t4", tmp_path / "node.yaml"),
        config=str(EXAMPLES / "time-slicing.yaml"),
        flags={"memory-isolation": "true", "cgroup-root": str(node.tree.root)},
        change=same_driver,
    )
    await second.registered(kubelet)
    again = Isolated(second, node.backend, node.tree)
    await again.until(lambda: again.isolation.passes > 0)
    assert dict(again.isolation.applied[a.pod_uid].limits) == {gpu: Limit(2 * SHARE)}
    assert node.backend.memory_limit(gpu, node.host_path(a.pod_uid)).hard == 2 * SHARE
    assert [e for e in logged[since:] if e.get("pod_uid") == a.pod_uid] == []  # never cleared
