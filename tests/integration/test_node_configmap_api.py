"""Per-node configs straight from the API: the whole Node as `gpuslice run --config-map`
wires it (a kubeconfig, NAMESPACE, NODE_NAME), against the API server stand-in over real
HTTP and the kubelet stand-in over real gRPC. No directory is mounted: the ConfigMap is
read and watched by name, and its annotation gpuslice.io/default-config names the default.

An edit applies within a second with no restart and touches only the resource it
changes; the label picks among the entries; a changed default annotation applies live;
a bad edit keeps the last good config with an Event; a refused watch, an API outage and
an expired watch never change what the kubelet is served, and the readiness detail says
so until the watch works again."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from agent_harness import GPU, node_running, registrations, serving
from node_harness import CONFIGS, NAMESPACE, NODE, REJECTED, WITHIN_S, time_slicing

from gpuslice.adapters.kube.rbac import RULES, Rule
from gpuslice.config.options import resolve_options
from gpuslice.core.errors import ConfigError
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.services.config_source import DEFAULT_ANNOTATION
from gpuslice.services.node import Node
from gpuslice.testing.apiserver import FakeApiServer, Grant, write_kubeconfig
from gpuslice.testing.apiserver.watches import STORAGE
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.node import build_node, node_api

CM = "gpuslice-configs"
CM_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
NODES = "/api/v1/nodes"
MIG_1G = "nvidia.com/mig-1g.5gb"
BROKEN = "version: v1\nflags:\n  migStrategy: bogus\n"


def mig_mixed(replicas: int) -> str:
    """MIG mixed, the 1g.5gb devices time-sliced: nvidia.com/gpu stays 1 device."""
    return (
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n"
        f"    resources:\n    - name: {MIG_1G}\n      replicas: {replicas}\n"
    )


def grants(rules: Iterable[Rule]) -> list[Grant]:
    """The rules as the chart binds them: the configmaps rule on CM only (resourceNames)."""
    return [
        Grant(
            group,
            frozenset(rule.resources),
            frozenset(rule.verbs),
            rule.namespace(NAMESPACE),
            frozenset({CM}) if rule.named_by == "config-map" else frozenset(),
        )
        for rule in rules
        for group in rule.api_groups
    ]


def without_configmap_watch() -> list[Grant]:
    """The documented rules, the ConfigMap's `watch` left out."""
    rules = [r for r in RULES if "configmaps" not in r.resources]
    rules += [
        Rule(r.api_groups, r.resources, ("get",), r.scope, r.needed_for, r.named_by)
        for r in RULES
        if "configmaps" in r.resources
    ]
    return grants(rules)


@dataclass
class Cluster:
    server: FakeApiServer
    node: Node
    data: dict[str, str]
    default: str

    def edit(self, entries: dict[str, str], *, notify: bool = True) -> None:
        """What `kubectl edit configmap` does: these entries replaced, the rest kept."""
        self.data = {**self.data, **entries}
        self._put(notify)

    def set_default(self, name: str) -> None:
        """What `helm upgrade --set config.default=<name>` does to the ConfigMap."""
        self.default = name
        self._put(True)

    def _put(self, notify: bool) -> None:
        annotations = {DEFAULT_ANNOTATION: self.default}
        self.server.put_config_map(NAMESPACE, CM, self.data, annotations, notify=notify)

    def set_label(self, value: str | None) -> None:
        self.server.put_node(NODE, {DEFAULT_LABEL: value} if value else {})

    def config(self) -> dict[str, Any]:
        ready, details = self.node.readiness()
        assert ready, details  # every resource served and registered, whatever the API does
        return dict(details["config"])

    async def settles(self, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Wait until `done()` holds, checking after each read the manager finishes (a
        change of the ConfigMap, of the label, or of the watch's trouble)."""
        manager = self.node.manager
        assert manager is not None
        async with asyncio.timeout(timeout_s):
            count = manager.checks
            while not done():
                count = await manager.wait_checked(count)

    def rejections(self) -> list[dict[str, Any]]:
        return [e for e in self.server.events if e["reason"] == REJECTED]


@contextlib.asynccontextmanager
async def cluster_of(
    kubelet: KubeletStandin,
    plugin_dir: str,
    tmp_path: Path,
    *,
    hardware: str,
    data: dict[str, str],
    default: str,
    expect: dict[str, int],
    grants: list[Grant] | None = None,
) -> AsyncIterator[Cluster]:
    server = FakeApiServer(grants)
    await server.start()
    server.put_node(NODE)
    server.put_config_map(NAMESPACE, CM, data, {DEFAULT_ANNOTATION: default})
    opts = resolve_options(
        {
            "kubelet-socket": os.path.join(plugin_dir, "kubelet.sock"),
            "config-map": CM,
            "node-name": NODE,
            "namespace": NAMESPACE,
            "kubeconfig": write_kubeconfig(tmp_path, server.url),
            "labels": "false",
        },
        fake_hardware=hardware,
    )
    try:
        async with node_running(opts, kubelet, expect, 10) as node:
            yield Cluster(server, node, dict(data), default)
    finally:
        await server.close()


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)


@pytest.fixture
async def cluster(
    kubelet: KubeletStandin, plugin_dir: str, tmp_path: Path, no_proxy: None
) -> AsyncIterator[Cluster]:
    """t4x4 with the ConfigMap ts-4 / ts-8 / shared-4, default ts-4 (16 devices)."""
    async with cluster_of(
        kubelet, plugin_dir, tmp_path, hardware="t4x4", data=CONFIGS, default="ts-4",
        expect={GPU: 16},
    ) as running:  # fmt: skip
        yield running


async def test_an_edit_applies_without_restart_and_only_the_changed_resource_gets_a_list(
    kubelet: KubeletStandin, plugin_dir: str, tmp_path: Path, no_proxy: None
) -> None:
    """MIG mixed: 1g.5gb replicas 2 -> 4 re-lists that resource alone; nvidia.com/gpu and
    the other MIG resources get no new list and nothing registers again."""
    async with cluster_of(
        kubelet, plugin_dir, tmp_path, hardware="a100-40gb-mig-mixed",
        data={"mig": mig_mixed(2)}, default="mig", expect={GPU: 1, MIG_1G: 4},
    ) as running:  # fmt: skip
        # Every resource's first list in, so later counts see only the edit's lists.
        settled = lambda k: len(k.resources()) == 4 and all(k.updates(r) for r in k.resources())  # noqa: E731
        await kubelet.wait_for(settled, WITHIN_S)
        others = [r for r in kubelet.resources() if r != MIG_1G]
        before = {r: kubelet.updates(r) for r in kubelet.resources()}
        running.edit({"mig": mig_mixed(4)})
        await kubelet.wait_for(lambda k: serving(k, {GPU: 1, MIG_1G: 8}), WITHIN_S)
        assert kubelet.updates(MIG_1G) == before[MIG_1G] + 1
        assert {r: kubelet.updates(r) for r in others} == {r: before[r] for r in others}
        assert set(registrations(kubelet).values()) == {1}
        assert running.config() == {
            "config": "mig",
            "ok": True,
            "detail": f"label {DEFAULT_LABEL} unset; default config",
        }


async def test_the_node_label_picks_among_the_configmaps_entries(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    cluster.set_label("ts-8")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 32}), WITHIN_S)
    assert cluster.config()["config"] == "ts-8"
    cluster.set_label(None)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), WITHIN_S)
    assert cluster.config()["config"] == "ts-4"
    assert registrations(kubelet) == {GPU: 1}


async def test_the_default_changed_in_the_annotation_applies_live(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    """`helm upgrade --set config.default=ts-8`: every unlabelled node switches, no restart;
    a labelled one keeps its label's entry."""
    cluster.set_default("ts-8")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 32}), WITHIN_S)
    assert cluster.config()["config"] == "ts-8"
    assert registrations(kubelet) == {GPU: 1}
    cluster.set_label("ts-4")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), WITHIN_S)
    manager = cluster.node.manager
    assert manager is not None
    seen = manager.checks
    cluster.set_default("shared-4")
    await cluster.settles(lambda: manager.checks > seen, WITHIN_S)
    assert cluster.config()["config"] == "ts-4"
    assert serving(kubelet, {GPU: 16})


async def test_a_bad_edit_keeps_the_last_good_config_with_an_event(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    """The entry is at fault, the same on every node: the Event is on the ConfigMap (one
    for the cluster), the node's readiness says what it keeps."""
    updates = kubelet.updates(GPU)
    cluster.edit({"ts-4": BROKEN})
    await cluster.server.wait_for(lambda s: bool(s.events))
    (event,) = cluster.rejections()
    assert event["metadata"]["namespace"] == NAMESPACE
    assert event["involvedObject"]["kind"] == "ConfigMap"
    assert event["message"].startswith(f"ConfigMap {NAMESPACE}/")
    assert 'flags.migStrategy: got "bogus"' in event["message"]
    detail = cluster.config()["detail"]
    assert cluster.config() == {"config": "ts-4", "ok": False, "detail": detail}
    assert detail == f"config rejected, keeping ts-4: {event['message']}"
    assert serving(kubelet, {GPU: 16})
    assert kubelet.updates(GPU) == updates
    cluster.edit({"ts-4": time_slicing(2)})  # the fix
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}), WITHIN_S)
    assert cluster.config()["ok"] is True
    assert len(cluster.rejections()) == 1


async def test_a_refused_watch_keeps_serving_and_says_so_until_granted(
    kubelet: KubeletStandin, plugin_dir: str, tmp_path: Path, no_proxy: None
) -> None:
    """RBAC without `watch` on configmaps: the first read works and is served; the watch
    gets 403 and is retried with backoff; readiness says so; nothing else changes."""
    async with cluster_of(
        kubelet, plugin_dir, tmp_path, hardware="t4x4", data=CONFIGS, default="ts-4",
        expect={GPU: 16}, grants=without_configmap_watch(),
    ) as running:  # fmt: skip
        await running.settles(lambda: "source" in running.config())
        status = running.config()
        assert (status["config"], status["ok"]) == ("ts-4", False)
        assert f"cannot follow ConfigMap {NAMESPACE}/{CM}, retrying" in status["source"]
        assert "HTTP 403" in status["source"]
        await running.server.wait_for(lambda s: len(s.answered(403)) >= 2)  # retried
        assert serving(kubelet, {GPU: 16})
        assert running.rejections() == []
        running.server.grants = grants(RULES)
        running.edit({"ts-4": time_slicing(2)})
        await kubelet.wait_for(lambda k: serving(k, {GPU: 8}), 5)  # next retry, then the edit
        await running.settles(lambda: "source" not in running.config())
        assert running.config()["ok"] is True


async def test_an_api_outage_keeps_serving_and_the_edit_made_meanwhile_applies_after(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    port = urlsplit(cluster.server.url).port
    assert port is not None
    await cluster.server.close()
    await cluster.settles(lambda: "source" in cluster.config())
    assert cluster.config()["config"] == "ts-4"
    assert serving(kubelet, {GPU: 16})
    cluster.edit({"ts-4": time_slicing(2)})
    await cluster.server.start(port)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}), 5)
    await cluster.settles(lambda: "source" not in cluster.config())
    assert registrations(kubelet) == {GPU: 1}


async def test_an_expired_watch_resumes_and_applies_the_edit_it_missed(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    watches = len(cluster.server.watches("configmaps"))
    cluster.edit({"ts-4": time_slicing(3)}, notify=False)  # only a re-read sees it
    cluster.server.expire_watches()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 12}), WITHIN_S)
    await cluster.server.wait_for(lambda s: len(s.watches("configmaps")) > watches)
    assert "source" not in cluster.config()
    assert cluster.rejections() == []


async def test_after_a_restart_a_server_refusing_streaming_lists_still_serves_switches_at_once(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    """An API server over etcd 3.4 refuses the streaming list a watch from now asks for
    (after its restart every version the agent holds is too old): both watches come
    back without it, and a label switch and a ConfigMap edit reach the kubelet through
    them within WITHIN_S, as without the refusal."""
    server = cluster.server
    server.watch_lists_refused = STORAGE
    await server.wait_for(lambda s: s.open_watches() == 1 and s.open_watches(CM_PATH) == 1)
    await server.restart()

    def plain(path: str) -> bool:
        last = server.watches(path)[-1]
        return server.open_watches(path) == 1 and "sendInitialEvents" not in last.query

    await server.wait_for(lambda s: plain(NODES) and plain(CM_PATH))
    assert [r.code for r in server.watches(CM_PATH) if "sendInitialEvents" in r.query] == [200]
    reads = len(server.of("GET", f"{NODES}/{NODE}")) + len(server.of("GET", f"{CM_PATH}/"))
    cluster.set_label("ts-8")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 32}), WITHIN_S)
    cluster.edit({"ts-8": time_slicing(2)})
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}), WITHIN_S)
    assert cluster.config()["config"] == "ts-8"
    after = len(server.of("GET", f"{NODES}/{NODE}")) + len(server.of("GET", f"{CM_PATH}/"))
    assert after == reads  # through the watches, not re-reads


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({}, "per-node configs need this node's name"),
        (
            {"node-name": NODE},
            "the ConfigMap is read through the Kubernetes API, and there is none",
        ),
        (
            {"node-name": NODE, "config-file-srcdir": "/tmp"},
            "give one source of per-node configs, not both",
        ),
    ],
    ids=["no-node-name", "no-cluster", "with-a-directory"],
)
def test_configmap_mode_refuses_to_start_without_what_it_needs(
    values: dict[str, str], problem: str
) -> None:
    """One-line errors before anything is served (where the options are resolved, or
    for a missing API where the node is built)."""

    def build() -> None:
        opts = resolve_options({"config-map": CM, **values}, fake_hardware="t4")
        build_node(opts, node_api(opts))

    with pytest.raises(ConfigError, match=problem) as caught:
        build()
    assert str(caught.value).startswith("--config-map (CONFIG_MAP) ")
    assert "\n" not in str(caught.value)
