"""The NodeApi contract, run against both implementations.

"kube" is KubeNodeApi over lightkube against the HTTP fake API server; "memory" is
MemoryNodeApi. Whatever the services may rely on is checked here once for both,
so the in-memory stand-in used by integration tests and the demo cannot drift
from the real adapter.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol

import pytest
from kube_fakes import FAST_BACKOFF, FakeApiServer, Follower, fake_client

from gpuslice.adapters.kube import KubeNodeApi, objects
from gpuslice.core.errors import BackendError
from gpuslice.core.labels import TIMESTAMP_LABEL
from gpuslice.core.ports import NodeApi
from gpuslice.testing.nodeapi import MemoryNodeApi

NS = "gpu-ops"


class Cluster(Protocol):
    """What a contract test does to the cluster behind `api`, and what it inspects."""

    api: NodeApi

    def relabel(self, node: str, labels: dict[str, str]) -> None: ...
    def touch(self, node: str) -> None: ...  # a change that leaves the labels alone
    def delete(self, node: str) -> None: ...
    def feature_labels(self, node: str) -> dict[str, str] | None: ...
    def writes(self) -> int: ...
    def events(self) -> list[tuple[str, str, str, str]]: ...
    async def cut_off(self) -> None: ...


class KubeCluster:
    def __init__(self, server: FakeApiServer, api: KubeNodeApi) -> None:
        self.server = server
        self.api: NodeApi = api
        self._touches = itertools.count()

    def relabel(self, node: str, labels: dict[str, str]) -> None:
        self.server.put_node(node, labels)

    def touch(self, node: str) -> None:
        labels = self.server.nodes[node]["metadata"]["labels"]
        self.server.put_node(node, labels, {"touched": str(next(self._touches))})

    def delete(self, node: str) -> None:
        self.server.delete_node(node)

    def feature_labels(self, node: str) -> dict[str, str] | None:
        stored = self.server.features.get((NS, objects.node_feature_name(node)))
        return None if stored is None else objects.spec_labels(stored)

    def writes(self) -> int:
        return len(self.server.of("POST", "nodefeatures")) + len(
            self.server.of("PUT", "nodefeatures")
        )

    def events(self) -> list[tuple[str, str, str, str]]:
        return [
            (e["involvedObject"]["name"], e["reason"], e["message"], e["type"])
            for e in self.server.events
        ]

    async def cut_off(self) -> None:
        await self.server.close()


class MemoryCluster:
    def __init__(self) -> None:
        self.memory = MemoryNodeApi()
        self.api: NodeApi = self.memory
        self._labels: dict[str, dict[str, str]] = {}

    def relabel(self, node: str, labels: dict[str, str]) -> None:
        self._labels[node] = labels
        self.memory.set_labels(node, labels)

    def touch(self, node: str) -> None:
        self.memory.set_labels(node, self._labels[node])

    def delete(self, node: str) -> None:
        self.memory.delete_node(node)

    def feature_labels(self, node: str) -> dict[str, str] | None:
        return self.memory.node_feature_labels(node, NS)

    def writes(self) -> int:
        return self.memory.writes

    def events(self) -> list[tuple[str, str, str, str]]:
        return [(e.node, e.reason, e.message, e.type) for e in self.memory.events]

    async def cut_off(self) -> None:
        self.memory.set_reachable(False)


@pytest.fixture(params=["kube", "memory"])
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    if request.param == "memory":
        yield MemoryCluster()
        return
    server = FakeApiServer()
    await server.start()
    client = fake_client(server.url, tmp_path)
    yield KubeCluster(server, KubeNodeApi(client, backoff_s=FAST_BACKOFF))
    await client.close()
    await server.close()


@pytest.fixture
async def follow(cluster: Cluster) -> AsyncIterator[Callable[[], Follower]]:
    """Start following n1's labels; followers close at teardown, before the server."""
    followers: list[Follower] = []

    def start() -> Follower:
        followers.append(Follower(cluster.api.watch_node_labels("n1")))
        return followers[-1]

    yield start
    for follower in followers:
        await follower.close()


async def test_watch_yields_the_read_then_each_label_change_once(
    cluster: Cluster, follow: Callable[[], Follower]
) -> None:
    cluster.relabel("n1", {"a": "1"})
    follower = follow()
    assert await follower.next() == {"a": "1"}
    cluster.touch("n1")
    cluster.relabel("n1", {"a": "2"})
    cluster.touch("n1")
    cluster.relabel("n1", {"a": "3"})
    assert await follower.next() == {"a": "2"}
    assert await follower.next() == {"a": "3"}


async def test_watch_yields_empty_labels_for_a_missing_or_deleted_node(
    cluster: Cluster, follow: Callable[[], Follower]
) -> None:
    follower = follow()
    assert await follower.next() == {}
    cluster.relabel("n1", {"a": "1"})
    assert await follower.next() == {"a": "1"}
    cluster.delete("n1")
    assert await follower.next() == {}


async def test_node_labels_reads_the_node_and_names_a_missing_one(cluster: Cluster) -> None:
    cluster.relabel("n1", {"a": "1"})
    assert await cluster.api.node_labels("n1") == {"a": "1"}
    with pytest.raises(BackendError, match=r"^node n2 not found in the Kubernetes API$") as err:
        await cluster.api.node_labels("n2")
    assert not err.value.transient


async def test_node_feature_is_written_only_when_its_labels_change(cluster: Cluster) -> None:
    assert cluster.feature_labels("n1") is None
    assert await cluster.api.publish_node_feature("n1", NS, {"a": "1"}) is True
    assert await cluster.api.publish_node_feature("n1", NS, {"a": "1"}) is False
    assert cluster.writes() == 1
    assert await cluster.api.publish_node_feature("n1", NS, {"a": "2"}) is True
    assert cluster.feature_labels("n1") == {"a": "2"}
    assert cluster.writes() == 2


async def test_a_new_timestamp_alone_rewrites_nothing(cluster: Cluster) -> None:
    """A restarted agent stamps its labels anew: the stored object already holds
    them, so a DaemonSet rollout does not rewrite every node's object."""
    stamped = {"a": "1", TIMESTAMP_LABEL: "1700000000"}
    assert await cluster.api.publish_node_feature("n1", NS, stamped) is True
    restamped = {**stamped, TIMESTAMP_LABEL: "1800000000"}
    assert await cluster.api.publish_node_feature("n1", NS, restamped) is False
    assert cluster.feature_labels("n1") == stamped
    assert await cluster.api.publish_node_feature("n1", NS, {"a": "1"}) is True  # stamp dropped
    assert await cluster.api.publish_node_feature("n1", NS, {**restamped, "a": "2"}) is True
    assert cluster.feature_labels("n1") == {"a": "2", TIMESTAMP_LABEL: "1800000000"}
    assert cluster.writes() == 3


async def test_events_are_recorded_on_the_node(cluster: Cluster) -> None:
    await cluster.api.record_event("n1", "ConfigApplied", "now t4", warning=False)
    await cluster.api.record_event("n1", "ConfigInvalid", "bad", warning=True)
    assert cluster.events() == [
        ("n1", "ConfigApplied", "now t4", "Normal"),
        ("n1", "ConfigInvalid", "bad", "Warning"),
    ]


async def test_an_unreachable_api_fails_reads_and_writes_but_never_events(
    cluster: Cluster,
) -> None:
    cluster.relabel("n1", {"a": "1"})
    await cluster.cut_off()
    for call in (
        cluster.api.node_labels("n1"),
        cluster.api.publish_node_feature("n1", NS, {"a": "1"}),
    ):
        with pytest.raises(BackendError, match="unreachable") as err:
            await call
        assert err.value.transient
        assert "\n" not in str(err.value)
    with pytest.raises(BackendError, match="unreachable"):
        await Follower(cluster.api.watch_node_labels("n1")).next()  # the first read fails
    await cluster.api.record_event("n1", "ConfigApplied", "x", warning=False)
    assert cluster.events() == []
