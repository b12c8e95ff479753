"""The whole Node, wired as `gpuslice run` wires it in a cluster (node_api: a kubeconfig, the
agent's namespace, POD_NAME), against the API server stand-in and the kubelet stand-in.

Labels that cannot be published (NFD's CRD missing: 404; RBAC: 403; a 5xx) never decide
whether a config is in force: a switch 16 -> 32 devices and back applies both ways and is
reported ok, no ConfigRejected Event is written, the labels report their own state in
readiness and catch up on their own. Under exactly the documented RBAC rules nothing is
refused, and a rejected config's Event lands in namespace default."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_harness import GPU, STOP_TIMEOUT_S, serving
from faults_harness import eventually
from node_harness import CONFIGS, NAMESPACE, NODE, REJECTED, WITHIN_S

from gpuslice.adapters.kube.rbac import RULES, Rule
from gpuslice.config.options import resolve_options
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.services.node import Node
from gpuslice.testing.apiserver import FakeApiServer, Grant, access_of, write_kubeconfig
from gpuslice.testing.configmap import write_configmap_volume
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.node import build_node, node_api

POD = "gpuslice-x7k2p"
FEATURE = (NAMESPACE, f"nvidia-features-for-{NODE}")
REPLICAS = "nvidia.com/gpu.replicas"


def grants(rules: Iterable[Rule]) -> list[Grant]:
    """What binding `rules` as docs/rbac.md says grants the agent in NAMESPACE."""
    return [
        Grant(group, frozenset(rule.resources), frozenset(rule.verbs), rule.namespace(NAMESPACE))
        for rule in rules
        for group in rule.api_groups
    ]


@dataclass
class Cluster:
    server: FakeApiServer
    node: Node
    stop: asyncio.Event
    task: asyncio.Task[None]

    def set_label(self, value: str | None) -> None:
        self.server.put_node(NODE, {DEFAULT_LABEL: value} if value else {})

    def config(self) -> dict[str, object]:
        ready, details = self.node.readiness()
        assert ready, details
        return dict(details["config"])

    def labels(self) -> dict[str, object]:
        return dict(self.node.readiness()[1]["labels"])

    async def labels_settle(self, ok: bool) -> None:
        labeller = self.node.labeller
        assert labeller is not None
        settled = labeller.wait_for(lambda: self.labels()["ok"] is ok)
        await asyncio.wait_for(settled, 5)

    def rejections(self) -> list[dict[str, Any]]:
        return [e for e in self.server.events if e["reason"] == REJECTED]

    def stored_replicas(self) -> str | None:
        stored = self.server.features.get(FEATURE)
        return None if stored is None else stored["spec"]["labels"].get(REPLICAS)


@pytest.fixture
async def cluster(
    kubelet: KubeletStandin,
    plugin_dir: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Cluster]:
    """A Node on t4x4 (default config ts-4: 16 devices) in NAMESPACE as Pod POD of a
    DaemonSet; `request.param` (if any) are the grants the server enforces."""
    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    server = FakeApiServer(getattr(request, "param", None))
    await server.start()
    server.put_node(NODE)
    daemonset = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpuslice", "uid": "ds-1"}
    server.put_pod(NAMESPACE, POD, [{**daemonset, "controller": True}])
    configs = tmp_path / "configs"
    configs.mkdir()
    write_configmap_volume(str(configs), CONFIGS)
    opts = resolve_options(
        {
            "kubelet-socket": os.path.join(plugin_dir, "kubelet.sock"),
            "config-file-srcdir": str(configs),
            "default-config": "ts-4",
            "node-name": NODE,
            "namespace": NAMESPACE,
            "pod-name": POD,
            "kubeconfig": write_kubeconfig(tmp_path, server.url),
        },
        fake_hardware="t4x4",
    )
    api = node_api(opts)
    assert api is not None
    node = build_node(opts, api)
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(stop))
    running = Cluster(server, node, stop, task)
    try:
        await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
        yield running
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, STOP_TIMEOUT_S)
        await api.aclose()
        await server.close()


async def switch_and_back(kubelet: KubeletStandin, cluster: Cluster) -> None:
    """ts-4 -> ts-8 -> ts-4: each applies, is in force with ok=true, nothing rejected."""
    cluster.set_label("ts-8")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 32}), WITHIN_S)
    assert cluster.config()["config"] == "ts-8"
    assert cluster.config()["ok"] is True
    cluster.set_label(None)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), WITHIN_S)
    assert cluster.config()["config"] == "ts-4"
    assert cluster.config()["ok"] is True
    assert cluster.rejections() == []


async def test_without_nfd_a_switch_applies_both_ways_and_the_labels_say_why_not(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    """A cluster without NFD: NodeFeature paths answer 404. (The labels published before
    NFD went away are not read back while unchanged, so the switch's new labels are the
    first to meet the 404.)"""
    cluster.server.nfd_installed = False
    await switch_and_back(kubelet, cluster)
    await cluster.labels_settle(ok=False)
    labels = cluster.labels()
    assert labels["ok"] is False
    assert "HTTP 404" in str(labels["detail"])
    assert "is NFD installed?" in str(labels["detail"])


@pytest.mark.parametrize(
    "cluster", [grants(r for r in RULES if "nodefeatures" not in r.resources)], indirect=True
)
async def test_without_the_nodefeature_rule_a_switch_applies_both_ways(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    """RBAC refuses the NodeFeature (403): only those requests fail, nothing else."""
    await cluster.labels_settle(ok=False)
    await switch_and_back(kubelet, cluster)
    assert "HTTP 403" in str(cluster.labels()["detail"])
    refused = {access_of(r.method, r.path, r.query) for r in cluster.server.answered(403)}
    assert {a.resource for a in refused if a} == {"nodefeatures"}


async def test_a_failed_publish_after_a_switch_catches_up_on_its_own(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    await cluster.labels_settle(ok=True)
    assert cluster.stored_replicas() == "4"
    cluster.server.fail_next("PUT", "nodefeatures", 500)
    cluster.set_label("ts-8")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 32}), WITHIN_S)
    assert cluster.config()["ok"] is True
    await cluster.server.wait_for(lambda s: bool(s.answered(500)))
    labeller = cluster.node.labeller
    assert labeller is not None
    caught_up = labeller.wait_for(lambda: cluster.stored_replicas() == "8")
    await asyncio.wait_for(caught_up, 5)  # the retry, a second later
    assert cluster.labels()["ok"] is True
    assert cluster.rejections() == []


@pytest.mark.parametrize("cluster", [grants(RULES)], indirect=True)
async def test_under_exactly_the_documented_rules_nothing_is_refused(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    """Labels with owners, a switch, a rejected config's Event (in default): no 403."""
    await cluster.labels_settle(ok=True)
    await switch_and_back(kubelet, cluster)
    cluster.set_label("h100-mps")  # no such entry: rejected, ts-4 keeps serving
    await cluster.server.wait_for(lambda s: bool(s.events))
    (event,) = cluster.rejections()
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"]["name"] == NODE
    feature = cluster.server.features[FEATURE]
    assert [o["kind"] for o in feature["metadata"]["ownerReferences"]] == ["DaemonSet", "Pod"]
    assert cluster.server.answered(403) == []
    assert cluster.server.answered(422) == []


async def test_after_an_api_server_restart_readiness_says_the_watch_is_down_until_it_is_back(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    """The Node unchanged across the restart: its old resourceVersion is older than the
    restarted server's watch cache (410). The watch comes back all the same, readiness
    says so while it is down, and a switch after the restart is served through it."""
    server = cluster.server
    await server.wait_for(lambda s: s.open_watches() == 1)
    down = asyncio.Event()
    restarting = asyncio.create_task(server.restart(down))
    api_detail = lambda: cluster.node.readiness()[1].get("api")  # noqa: E731
    await eventually(lambda: api_detail() is not None, "readiness saying the watch is down")
    detail = api_detail()
    assert detail is not None
    assert detail["ok"] is False
    assert f"watch of Node {NODE} down" in detail["detail"]
    assert cluster.node.readiness()[0]  # still serving what it last read
    down.set()
    await restarting
    await server.wait_for(lambda s: s.open_watches() == 1)
    await eventually(lambda: api_detail() is None, "readiness saying the watch is back")
    reads = len(server.of("GET", f"/api/v1/nodes/{NODE}"))
    await switch_and_back(kubelet, cluster)
    assert len(server.of("GET", f"/api/v1/nodes/{NODE}")) == reads  # through the watch
