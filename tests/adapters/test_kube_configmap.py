"""The ConfigMap of per-node configs followed through the API: KubeNodeApi.watch_config_map
against the API server stand-in over real HTTP, and MemoryNodeApi's twin of it.

The watch follows the Node watch's rules (a full read first, resume from its version, 410
and dropped connections re-read) and also says when it is in trouble (`trouble`) until a
watch request is answered again, so the agent can report a stale view."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kube_fakes import FAST_BACKOFF, FakeApiServer, Following, Grant, fake_client

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import ConfigMapView
from gpuslice.testing.nodeapi import MemoryNodeApi

NS = "gpu-operator"
NAME = "gpuslice-configs"
GET = f"/api/v1/namespaces/{NS}/configmaps/{NAME}"
DATA = {"ts-4": "version: v1\n", "ts-8": "version: v1\n"}
DEFAULT = {"gpuslice.io/default-config": "ts-4"}

Follow = Callable[[], Following[ConfigMapView]]


@pytest.fixture
async def follow(server: FakeApiServer, tmp_path: Path) -> AsyncIterator[Follow]:
    client = fake_client(server.url, tmp_path)
    api = KubeNodeApi(client, backoff_s=FAST_BACKOFF)
    followers: list[Following[ConfigMapView]] = []

    def start() -> Following[ConfigMapView]:
        followers.append(Following(api.watch_config_map(NS, NAME)))
        return followers[-1]

    yield start
    for follower in followers:
        await follower.close()
    await client.close()


async def watching(server: FakeApiServer, requests: int) -> None:
    await server.wait_for(
        lambda s: len(s.watches("configmaps")) == requests and s.open_watches("configmaps") == 1
    )


async def test_first_yield_is_the_full_read_then_each_edit_once(
    server: FakeApiServer, follow: Follow
) -> None:
    """Data and annotations are read by name and watched by field selector on the name;
    an edit of another ConfigMap in the namespace yields nothing."""
    version = server.put_config_map(NS, NAME, DATA, DEFAULT)
    follower = follow()
    assert await follower.next() == ConfigMapView(DATA, DEFAULT)
    await watching(server, 1)
    read, watch = server.requests
    assert (read.method, read.path) == ("GET", GET)
    assert watch.path == f"/api/v1/namespaces/{NS}/configmaps"
    assert watch.query["fieldSelector"] == f"metadata.name={NAME}"
    assert watch.query["resourceVersion"] == version
    server.put_config_map(NS, "other", {"x": "y"})
    server.put_config_map(NS, NAME, {**DATA, "ts-8": "version: v1\nflags: {}\n"}, DEFAULT)
    edited = await follower.next()
    assert edited.data is not None
    assert edited.data["ts-8"].endswith("flags: {}\n")
    server.put_config_map(NS, NAME, DATA, {"gpuslice.io/default-config": "ts-8"})
    assert (await follower.next()).annotations == {"gpuslice.io/default-config": "ts-8"}
    assert follower.pending() == 0


async def test_a_missing_configmap_reads_as_none_and_its_creation_and_deletion_show(
    server: FakeApiServer, follow: Follow
) -> None:
    follower = follow()
    assert await follower.next() == ConfigMapView(None)
    await watching(server, 1)
    assert "resourceVersion" not in server.watches("configmaps")[0].query
    server.put_config_map(NS, NAME, DATA)
    assert (await follower.next()).data == DATA
    server.delete_config_map(NS, NAME)
    assert await follower.next() == ConfigMapView(None)


async def test_410_gone_rereads_and_resumes_without_trouble(
    server: FakeApiServer, follow: Follow
) -> None:
    """An expired watch is routine: the edit it missed arrives by the re-read, and the
    view is never reported as in trouble."""
    server.put_config_map(NS, NAME, DATA)
    follower = follow()
    await follower.next()
    await watching(server, 1)
    missed = server.put_config_map(NS, NAME, {"ts-2": "version: v1\n"}, notify=False)
    server.expire_watches()
    assert await follower.next() == ConfigMapView({"ts-2": "version: v1\n"})
    await watching(server, 2)
    assert server.watches("configmaps")[1].query["resourceVersion"] == missed
    assert len(server.of("GET", GET)) == 2
    assert follower.pending() == 0


async def test_a_refused_watch_is_trouble_retried_until_granted(
    server: FakeApiServer, follow: Follow
) -> None:
    """RBAC allows the read but not the watch: the last read is yielded with a one-line
    403, retried with backoff without yielding again; once granted, the trouble clears."""
    server.grants = [Grant("", frozenset({"configmaps"}), frozenset({"get"}), NS)]
    server.put_config_map(NS, NAME, DATA)
    follower = follow()
    assert (await follower.next()).trouble is None
    stale = await follower.next()
    assert stale.data == DATA
    assert stale.trouble is not None
    assert stale.trouble.startswith("watch: HTTP 403: configmaps")
    assert "cannot watch resource" in stale.trouble
    assert "\n" not in stale.trouble
    await server.wait_for(lambda s: len(s.answered(403)) >= 3)  # retried
    assert follower.pending() == 0
    server.grants = None
    assert await follower.next() == ConfigMapView(DATA)
    server.put_config_map(NS, NAME, {"ts-2": "version: v1\n"})
    assert (await follower.next()).data == {"ts-2": "version: v1\n"}


async def test_an_outage_is_trouble_and_the_view_catches_up_after_it(
    server: FakeApiServer, follow: Follow
) -> None:
    """The server goes away (connections cut, then refused) and comes back on the same
    port with an edit made meanwhile: trouble, then the edit, then no trouble."""
    server.put_config_map(NS, NAME, DATA)
    follower = follow()
    await follower.next()
    await watching(server, 1)
    port = urlsplit(server.url).port
    assert port is not None
    await server.close()
    stale = await follower.next()
    assert (stale.data, stale.trouble is not None) == (DATA, True)
    server.put_config_map(NS, NAME, {"ts-2": "version: v1\n"})
    await server.start(port)
    views = [await follower.next()]
    while views[-1].trouble is not None or views[-1].data != {"ts-2": "version: v1\n"}:
        views.append(await follower.next())
    assert views[-1] == ConfigMapView({"ts-2": "version: v1\n"})


async def test_the_first_read_failing_is_a_backend_error(
    server: FakeApiServer, follow: Follow
) -> None:
    server.fail_next("GET", GET, 403)
    with pytest.raises(BackendError, match=f"read ConfigMap {NS}/{NAME}: HTTP 403"):
        await follow().next()


async def test_the_memory_twin_follows_edits_deletion_and_reachability() -> None:
    api = MemoryNodeApi()
    api.put_config_map(NS, NAME, DATA, DEFAULT)
    follower = Following(api.watch_config_map(NS, NAME))
    try:
        assert await follower.next() == ConfigMapView(DATA, DEFAULT)
        api.set_reachable(False)
        assert (await follower.next()).trouble == (
            "watch ConfigMap: Kubernetes API unreachable (simulated)"
        )
        api.put_config_map(NS, NAME, {"ts-2": "version: v1\n"})  # unseen while unreachable
        api.set_reachable(True)
        assert await follower.next() == ConfigMapView({"ts-2": "version: v1\n"})
        api.delete_config_map(NS, NAME)
        assert await follower.next() == ConfigMapView(None)
    finally:
        await follower.close()
    api.set_reachable(False)
    with pytest.raises(BackendError, match="unreachable"):
        await anext(api.watch_config_map(NS, NAME))


async def test_a_problem_of_the_configmap_is_one_event_on_it_however_many_nodes_report_it(
    server: FakeApiServer, tmp_path: Path
) -> None:
    """Ten nodes find the same bad entry: the first creates the Event (its name follows
    from the problem), the others find it fresh and write nothing; one finding it again
    once it is old bumps its count and time; another problem is another Event."""
    server.put_config_map(NS, NAME, DATA, DEFAULT)
    client = fake_client(server.url, tmp_path)
    apis = [KubeNodeApi(client, host=f"n{i}") for i in range(10)]
    try:
        views = Following(apis[0].watch_config_map(NS, NAME))  # the read gives the uid
        await views.next()
        await views.close()
        problem = f"ConfigMap {NS}/{NAME}[ts-8]: bad"
        for api in apis:
            assert await api.report_config_problem(NS, NAME, "ConfigRejected", problem)
        (event,) = server.events
        assert event["metadata"]["namespace"] == NS
        uid = server.config_maps[(NS, NAME)]["metadata"]["uid"]
        about = {"apiVersion": "v1", "kind": "ConfigMap", "name": NAME, "namespace": NS}
        assert event["involvedObject"] == {**about, "uid": uid}
        assert (event["type"], event["reason"], event["message"]) == (
            "Warning",
            "ConfigRejected",
            problem,
        )
        assert event["count"] == 1
        assert [r.method for r in server.requests if "/events" in r.path].count("POST") == 1
        event["lastTimestamp"] = "2020-01-01T00:00:00Z"  # reported long ago
        assert await apis[3].report_config_problem(NS, NAME, "ConfigRejected", problem)
        assert await apis[4].report_config_problem(NS, NAME, "ConfigRejected", problem)
        (event,) = server.events
        assert event["count"] == 2  # bumped once: the second found it fresh again
        assert await apis[5].report_config_problem(NS, NAME, "ConfigRejected", problem + "!")
        assert len(server.events) == 2
    finally:
        await client.close()
