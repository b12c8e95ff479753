"""MIG layouts by node label (--mig-parted-config) through the whole Node, against the
kubelet stand-in (with PodResources) on a simulated A100-40GB (GPU 0) and H100-80GB
(GPU 1): the label names a config, the state goes pending then success, and the new MIG
resources are advertised live while the untouched GPU keeps its device and its
registration; an edit of the mounted file is followed without a label change; a device a
pod holds keeps its GPU pending, naming the pod, until the pod is gone; a restart after an
apply cut short converges; an Ampere mode change waits for an idle GPU; a bad config is
refused in one line and nothing changes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import GPU, STOP_TIMEOUT_S, pod_resources_socket, registrations, serving
from node_harness import NODE, NodeLauncher, RunningNode

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.nodefile import parse_node
from gpuslice.config.options import resolve_options
from gpuslice.core.errors import ConfigError
from gpuslice.core.mig import GpuInstance
from gpuslice.core.mig_reconcile import CONFIG_LABEL, FAILED, PENDING, STATE_LABEL, SUCCESS
from gpuslice.services.mig_manager import MigManager
from gpuslice.testing.configmap import write_configmap_volume
from gpuslice.testing.kubelet import AdmissionError, KubeletStandin
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.agent import Parts
from gpuslice.wiring.node import build_node

WITHIN_S = 30.0
MIG_1G, MIG_2G, MIG_3G = "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"
H100_1G = "nvidia.com/mig-1g.10gb"
MIXED = {"mixed": "version: v1\nflags:\n  migStrategy: mixed\n"}
NODE_FILE = "name: mig-node\ngpus:\n  - model: a100-40gb\n  - model: h100-80gb\n"
BUSY_A100 = (
    "name: mig-node\ngpus:\n  - model: a100-40gb\n    processes: [{pid: 4242, used_mib: 1024}]\n"
    "  - model: h100-80gb\n"
)
MIG_PARTED = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  a100-balanced:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  a100-1g:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  a100-3g:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
  all-1g:
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - device-filter: "0x233010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  too-many:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2, "2g.10gb": 1}
  unknown-profile:
    - devices: all
      mig-enabled: true
      mig-devices: {"4g.40gb": 1}
"""


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    async with KubeletStandin(plugin_dir, pod_resources_socket(plugin_dir)) as standin:
        yield standin


@pytest.fixture
async def nodes(plugin_dir: str, tmp_path: Path) -> AsyncIterator[NodeLauncher]:
    async with NodeLauncher(plugin_dir, tmp_path) as launcher:
        yield launcher


class Cluster:
    def __init__(self, work: Path, plugin_dir: str, hardware: str = NODE_FILE) -> None:
        self.mounted = work / "mig"  # the ConfigMap's volume, as the kubelet writes it
        self.mounted.mkdir()
        self.edit(MIG_PARTED)
        self.mig_parted = self.mounted / "config.yaml"
        self.hardware = work / "node.yaml"
        self.hardware.write_text(hardware)
        self.events = Path(plugin_dir) / "events.jsonl"
        self.api = MemoryNodeApi({NODE: {}})

    def edit(self, text: str) -> None:
        """The ConfigMap edited: the kubelet swaps `..data` in the mounted volume."""
        write_configmap_volume(str(self.mounted), {"config.yaml": text})

    def label(self, value: str | None) -> None:
        """`kubectl label node <node> nvidia.com/mig.config=<value>`."""
        self.api.set_labels(NODE, {} if value is None else {CONFIG_LABEL: value})

    def inject(self, line: dict[str, object]) -> None:
        with self.events.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    async def start(self, nodes: NodeLauncher, backend: FakeBackend | None = None) -> RunningNode:
        def shared(chosen: Parts) -> Parts:  # one simulated machine across agents
            return (
                chosen
                if backend is None
                else dataclasses.replace(chosen, open_backend=lambda: backend)
            )

        return await nodes.start(
            str(self.hardware),
            configs=MIXED,
            default="mixed",
            api=self.api,
            flags={
                "mig-parted-config": str(self.mig_parted),
                "pod-resources-socket": pod_resources_socket(nodes.plugin_dir),
            },
            change=shared,
        )


def mig(running: RunningNode) -> MigManager:
    assert running.node.mig is not None
    return running.node.mig


async def settled(running: RunningNode, state: str, config: str | None = None) -> None:
    manager = mig(running)
    done = lambda: manager.state == state and (config is None or manager.value == config)  # noqa: E731
    await asyncio.wait_for(manager.wait_for(done), WITHIN_S)


def reasons(cluster: Cluster) -> list[str]:
    return [e.reason for e in cluster.api.events if e.reason.startswith("MigConfig")]


async def test_a_label_makes_the_layout_and_serves_it_live_leaving_the_other_gpu_alone(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, plugin_dir: str
) -> None:
    cluster = Cluster(tmp_path, plugin_dir)
    running = await cluster.start(nodes)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 2}))
    h100 = running.node.devices.snapshot.gpus[1].uuid
    assert mig(running).state is None  # no label: nothing asked, nothing touched

    cluster.label("a100-balanced")
    want = {GPU: 1, MIG_1G: 2, MIG_2G: 1, MIG_3G: 1}
    await kubelet.wait_for(lambda k: serving(k, want), WITHIN_S)
    await settled(running, SUCCESS, "a100-balanced")

    assert reasons(cluster) == ["MigConfigPending", "MigConfigApplied"]
    assert registrations(kubelet)[GPU] == 1  # the H100's resource never registered again
    assert list(kubelet.devices(GPU)) == [h100]
    assert kubelet.stale_streams == []
    assert running.sink is not None
    await asyncio.wait_for(
        running.node.labeller.wait_for(  # type: ignore[union-attr]
            lambda: (running.sink.published or [{}])[-1].get(STATE_LABEL) == SUCCESS  # type: ignore[union-attr]
        ),
        WITHIN_S,
    )
    ready, details = running.node.readiness()
    assert ready
    assert details["migManager"] == {"ok": True, "detail": "a100-balanced: success"}


async def test_a_held_device_keeps_its_gpu_pending_naming_the_pod_until_it_is_gone(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, plugin_dir: str
) -> None:
    cluster = Cluster(tmp_path, plugin_dir)
    cluster.label("all-1g")
    running = await cluster.start(nodes)
    await settled(running, SUCCESS, "all-1g")
    await kubelet.wait_for(lambda k: serving(k, {MIG_1G: 7, H100_1G: 7}), WITHIN_S)
    await kubelet.admit("ml/train-0", {"main": {MIG_1G: 1}})
    await kubelet.admit("ml/infer-0", {"main": {H100_1G: 1}})

    cluster.label("a100-3g")  # GPU 0 must change; GPU 1 (H100) is named by no entry
    await settled(running, PENDING, "a100-3g")
    assert "GPU 0 (NVIDIA A100-SXM4-40GB)" in mig(running).reason
    assert "by pod ml/train-0" in mig(running).reason
    assert "infer-0" not in mig(running).reason  # a device on an unchanged GPU holds nothing
    (event,) = [e for e in cluster.api.events if e.reason == "MigConfigPending"][-1:]
    assert "pod ml/train-0" in event.message
    assert event.type == "Warning"
    assert serving(kubelet, {MIG_1G: 7, H100_1G: 7})  # nothing destroyed

    await kubelet.release("ml/train-0")
    await kubelet.wait_for(lambda k: serving(k, {MIG_3G: 2, H100_1G: 7}), WITHIN_S)
    await settled(running, SUCCESS, "a100-3g")
    assert registrations(kubelet)[H100_1G] == 1


async def test_a_restart_after_an_apply_cut_short_converges(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, plugin_dir: str
) -> None:
    cluster = Cluster(tmp_path, plugin_dir)
    machine = FakeBackend(parse_node(NODE_FILE, "node.yaml"), str(cluster.events))
    a100 = machine.snapshot().gpus[0].uuid
    cluster.inject({"mig_fault": {"gpu": 0, "call": "create", "error": "UNKNOWN"}})
    cluster.label("a100-balanced")
    first = await cluster.start(nodes, machine)
    await settled(first, FAILED)  # the mode changed, then the first create failed
    mig_control = machine.mig_control()
    assert mig_control.mig_mode(a100) == (True, True)
    assert mig_control.instances(a100) == ()
    await first.shutdown()

    second = await cluster.start(nodes, machine)
    await settled(second, SUCCESS, "a100-balanced")
    await kubelet.wait_for(
        lambda k: serving(k, {GPU: 1, MIG_1G: 2, MIG_2G: 1, MIG_3G: 1}), WITHIN_S
    )


async def test_an_ampere_mode_change_waits_for_an_idle_gpu(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, plugin_dir: str
) -> None:
    cluster = Cluster(tmp_path, plugin_dir, BUSY_A100)
    cluster.label("all-1g")
    running = await cluster.start(nodes)
    await settled(running, PENDING, "all-1g")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 1, H100_1G: 7}), WITHIN_S)  # Hopper: no reset
    assert "GPU 0: the MIG mode change resets the GPU" in mig(running).reason
    assert mig(running).state == PENDING

    cluster.inject({"process_exit": 4242})
    await settled(running, SUCCESS, "all-1g")
    await kubelet.wait_for(lambda k: serving(k, {MIG_1G: 7, H100_1G: 7}), WITHIN_S)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ("a100-balance", 'no config "a100-balance"; did you mean a100-balanced?'),
        ("too-many", "1 x 2g.10gb, 2 x 3g.20gb is 8 slices, more slices than the GPU has (7)"),
        ("unknown-profile", "GPU 0 (NVIDIA A100-SXM4-40GB): no MIG profile 4g.40gb (the GPU has:"),
    ],
)
async def test_a_bad_config_is_refused_in_one_line_and_nothing_changes(
    kubelet: KubeletStandin,
    nodes: NodeLauncher,
    tmp_path: Path,
    plugin_dir: str,
    config: str,
    problem: str,
) -> None:
    cluster = Cluster(tmp_path, plugin_dir)
    running = await cluster.start(nodes)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 2}))
    updates = kubelet.updates(GPU)

    cluster.label(config)
    await settled(running, FAILED, config)
    reason = mig(running).reason
    assert problem in reason
    assert "\n" not in reason
    assert reasons(cluster) == ["MigConfigFailed"]
    assert serving(kubelet, {GPU: 2})
    assert kubelet.updates(GPU) == updates
    assert kubelet.endpoint(MIG_1G) is None
    assert kubelet.endpoint(MIG_3G) is None


async def test_an_edit_of_the_mounted_file_is_followed_without_a_label_change(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, plugin_dir: str
) -> None:
    cluster = Cluster(tmp_path, plugin_dir)
    cluster.label("later")
    running = await cluster.start(nodes)
    await settled(running, FAILED, "later")
    assert 'no config "later"' in mig(running).reason

    cluster.edit(MIG_PARTED + "  later:\n    - devices: [1]\n      mig-enabled: true\n"
                 '      mig-devices: {"3g.40gb": 2}\n')  # fmt: skip
    await settled(running, SUCCESS, "later")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 1, "nvidia.com/mig-3g.40gb": 2}), WITHIN_S)


class GatedCreates(FakeBackend):
    """The simulated driver, whose creates wait until the test lets them go (a real create
    takes about a second)."""

    def __init__(self, node_file: str, events: str) -> None:
        super().__init__(parse_node(node_file, "node.yaml"), events)
        self.creating, self.go = threading.Event(), threading.Event()

    def create(self, gpu_uuid: str, profile: str, start: int) -> GpuInstance:
        self.creating.set()
        self.go.wait(WITHIN_S)
        return super().create(gpu_uuid, profile, start)


async def test_a_stop_in_the_middle_of_an_apply_stops_the_node(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, plugin_dir: str
) -> None:
    """The pass is cut short (the next start takes it up): it never waits on an agent
    that no longer serves."""
    cluster = Cluster(tmp_path, plugin_dir)
    machine = GatedCreates(NODE_FILE, str(cluster.events))
    cluster.label("a100-balanced")
    running = await cluster.start(nodes, machine)
    assert await asyncio.to_thread(machine.creating.wait, WITHIN_S)
    running.stop.set()
    machine.go.set()
    await asyncio.wait_for(running.task, STOP_TIMEOUT_S)


async def test_the_devices_of_a_gpu_being_changed_are_withdrawn_before_its_steps(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, plugin_dir: str
) -> None:
    """No pod is given a device about to go: the changing GPU's devices are Unhealthy
    from before its first step until the new ones are served; the other GPU's stay."""
    cluster = Cluster(tmp_path, plugin_dir)
    machine = GatedCreates(NODE_FILE, str(cluster.events))
    machine.go.set()
    cluster.label("all-1g")
    running = await cluster.start(nodes, machine)
    await settled(running, SUCCESS, "all-1g")
    await kubelet.wait_for(lambda k: serving(k, {MIG_1G: 7, H100_1G: 7}), WITHIN_S)

    machine.go.clear()
    machine.creating.clear()
    cluster.label("a100-3g")
    assert await asyncio.to_thread(machine.creating.wait, WITHIN_S)  # destroyed, creating
    await kubelet.wait_for(lambda k: k.node_status().allocatable[MIG_1G] == 0, WITHIN_S)
    with pytest.raises(AdmissionError):
        await kubelet.admit("late", {"main": {MIG_1G: 1}})
    assert serving(kubelet, {H100_1G: 7})

    machine.go.set()
    await kubelet.wait_for(lambda k: serving(k, {MIG_3G: 2, H100_1G: 7}), WITHIN_S)
    await settled(running, SUCCESS, "a100-3g")


async def test_without_podresources_no_gpu_changes(
    plugin_dir: str, nodes: NodeLauncher, tmp_path: Path
) -> None:
    """Who holds what unknown (the kubelet serves no PodResources): every change waits."""
    cluster = Cluster(tmp_path, plugin_dir)
    async with KubeletStandin(plugin_dir) as kubelet:  # no PodResources socket
        running = await cluster.start(nodes)
        await kubelet.wait_for(lambda k: serving(k, {GPU: 2}))
        cluster.label("a100-balanced")
        await settled(running, PENDING, "a100-balanced")
        assert "which pods hold the GPUs' devices cannot be read" in mig(running).reason
        assert serving(kubelet, {GPU: 2})
        assert kubelet.endpoint(MIG_1G) is None
        await running.shutdown()


def test_the_file_is_named_by_flag_or_env_var_and_needs_the_node_to_follow(
    tmp_path: Path,
) -> None:
    by_env = resolve_options({}, {"MIG_PARTED_CONFIG_FILE": "/etc/mig/config.yaml"}, command="run")
    assert by_env.device_plugin.mig_parted_config == "/etc/mig/config.yaml"
    assert resolve_options({}, {}, command="run").device_plugin.mig_parted_config == ""
    opts = resolve_options(
        {"mig-parted-config": str(tmp_path / "config.yaml"), "kubelet-socket": ""},
        fake_hardware="t4",
    )
    with pytest.raises(ConfigError, match=r"^--mig-parted-config \(MIG_PARTED_CONFIG_FILE\) "):
        build_node(opts, None)


def test_the_file_and_dra_dynamic_mig_together_are_refused_in_one_line(tmp_path: Path) -> None:
    """Both would change MIG layouts, each undoing the other's."""
    flags = {"mig-parted-config": str(tmp_path / "config.yaml"), "node-name": NODE,
             "kubeconfig": str(tmp_path / "kubeconfig"), "cdi-spec-dir": str(tmp_path)}  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"^--mig-parted-config .* --dra-dynamic-mig .*: choose one$"
    ):
        resolve_options({**flags, "dra": "true", "dra-dynamic-mig": "true"}, command="run")
    assert resolve_options({**flags, "dra": "true"}, command="run").device_plugin.mig_parted_config
