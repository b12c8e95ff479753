"""`gpuslice inspect` says what the agent does: on the same simulated node, cgroup tree and
config, the labels inspect shows are exactly those the running agent publishes to the API
server stand-in (time-slicing, MPS, with and without memory isolation), and the memory limit
it shows for each share is the one the agent sets on a pod holding that share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import GPU, node_running
from mps_harness import kill_daemons, mps_config
from process_harness import run_once

from gpuslice.config.options import resolve_options
from gpuslice.core.isolation import LABEL, MIB
from gpuslice.core.labels import TIMESTAMP_LABEL
from gpuslice.services.node import Node
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.cgroups import CgroupTree, r615_node
from gpuslice.testing.kubelet import KubeletStandin

NODE = "gpu-node-3"
NAMESPACE = "gpu-operator"
POD = "gpuslice-q8w2z"
FEATURE = (NAMESPACE, f"nvidia-features-for-{NODE}")
T4_MIB = 15360
TIME_SLICING = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"  # noqa: E501


class Cluster:
    def __init__(self, server: FakeApiServer, node: Node, flags: dict[str, str]) -> None:
        self.server, self.node, self.flags = server, node, flags

    def published(self) -> dict[str, str] | None:
        stored = self.server.features.get(FEATURE)
        if stored is None:
            return None
        return {k: v for k, v in stored["spec"]["labels"].items() if k != TIMESTAMP_LABEL}

    def inspect(self, *more: str) -> dict[str, object]:
        """`gpuslice inspect --output json` with the agent's own node, config and tree."""
        args = [f"--{name}={value}" for name, value in self.flags.items()]
        done = run_once("inspect", *args, *more, "--output", "json")
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))


@contextlib.asynccontextmanager
async def cluster(
    kubelet: KubeletStandin, plugin_dir: str, tmp_path: Path, config: str, isolation: bool
) -> AsyncIterator[Cluster]:
    """The whole agent on a 4x T4 r615 node, a cgroup v2 tree with the dmem controller and
    the kubelet's kubepods cgroup, `config`; labels published as NodeFeature objects."""
    node_file = r615_node("t4x4", tmp_path / "node.yaml")
    tree = CgroupTree(tmp_path / "cgroup")
    tree.make_root(f"00000000:00:{bus}.0" for bus in ("1B", "1C", "1D", "1E"))  # t4x4's GPUs
    tree.make_kubepods()
    (tmp_path / "config.yaml").write_text(config)
    flags = {
        "fake-hardware": node_file,
        "config-file": str(tmp_path / "config.yaml"),
        "cgroup-root": str(tree.root),
        "memory-isolation": str(isolation).lower(),
    }
    server = FakeApiServer()
    await server.start()
    server.put_node(NODE)
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpuslice", "uid": "ds-1"}
    server.put_pod(NAMESPACE, POD, [{**owner, "controller": True}])
    agent_flags = {k: v for k, v in flags.items() if k != "fake-hardware"}
    opts = resolve_options(
        {
            **agent_flags,
            "kubelet-socket": os.path.join(plugin_dir, "kubelet.sock"),
            "node-name": NODE,
            "namespace": NAMESPACE,
            "pod-name": POD,
            "kubeconfig": write_kubeconfig(tmp_path, server.url),
        },
        fake_hardware=node_file,
    )
    try:
        async with node_running(opts, kubelet, {GPU: 16}, 20) as node:
            yield Cluster(server, node, flags)
    finally:
        await server.close()


def _mps(plugin_dir: str) -> str:
    return mps_config(Path(plugin_dir) / "mps")


@pytest.mark.parametrize("isolation", [False, True], ids=["no-isolation", "isolation"])
@pytest.mark.parametrize("sharing", ["time-slicing", "mps"])
async def test_inspect_shows_exactly_the_labels_the_agent_publishes(
    kubelet: KubeletStandin, plugin_dir: str, tmp_path: Path, sharing: str, isolation: bool
) -> None:
    config = TIME_SLICING if sharing == "time-slicing" else _mps(plugin_dir)
    try:
        async with cluster(kubelet, plugin_dir, tmp_path, config, isolation) as running:
            labeller = running.node.labeller
            assert labeller is not None

            def settled() -> bool:  # the isolation label follows the service's first pass
                labels = running.published()
                return labels is not None and (LABEL in labels) is isolation

            await asyncio.wait_for(labeller.wait_for(settled), 20)
            report = running.inspect()
            assert report["labels"] == running.published()
    finally:
        kill_daemons(Path(plugin_dir) / "mps")
    assert (LABEL in running.published()) is isolation  # type: ignore[operator]


async def test_inspect_shows_the_limit_the_agent_sets_on_a_pod_holding_one_share(
    kubelet: KubeletStandin, plugin_dir: str, tmp_path: Path
) -> None:
    async with cluster(kubelet, plugin_dir, tmp_path, TIME_SLICING, isolation=True) as running:
        report = running.inspect()
        shares = [s for g in report["gpus"] for s in g["servedAs"]]  # type: ignore[attr-defined]
        assert {s["hardLimitBytes"] for s in shares} == {T4_MIB * MIB // 4}
        assert {s["softLimitBytes"] for s in shares} == {None}
        table = run_once("inspect", *[f"--{k}={v}" for k, v in running.flags.items()]).stdout
        assert "nvidia.com/gpu (4 replicas, 3840 MiB limit each)" in table

        isolation = running.node.isolation
        assert isolation is not None
        (pod,) = await kubelet.admit("a", {"main": {GPU: 1}})
        CgroupTree(running.flags["cgroup-root"]).create_pod(pod.pod_uid)
        while pod.pod_uid not in isolation.applied or not isolation.applied[pod.pod_uid].limits:
            isolation.nudge()
            await asyncio.sleep(0.01)
        (limit,) = isolation.applied[pod.pod_uid].limits.values()
        assert limit.hard == shares[0]["hardLimitBytes"]

        off = running.inspect("--memory-isolation=false")
        assert {s["hardLimitBytes"] for g in off["gpus"] for s in g["servedAs"]} == {None}  # type: ignore[attr-defined]
