"""Watches from now as streaming lists (sendInitialEvents), and the fallback when a server
refuses them, against the API server stand-in over real HTTP.

A watch from now (after a restart made every held version too old) asks for a streaming
list: the object as ADDED, then the bookmark that ends the initial events, whose version
a later watch resumes from. A server whose storage cannot serve one (etcd 3.4, a feature
gate, a proxy) refuses it; the follower then watches from now without it, at once and
for good, instead of retrying the refused request with re-reads in between.
"""

from __future__ import annotations

import json

import httpx2
import pytest
from kube_fakes import NODES, FakeApiServer, Follower, Following

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.testing.apiserver.watches import INITIAL_EVENTS_END, REFUSED_WATCH_LIST, STORAGE

NS = "gpu-operator"
CM = "gpuslice-configs"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
LISTING = {"watch": "true", "fieldSelector": "metadata.name=n1", "sendInitialEvents": "true",
           "allowWatchBookmarks": "true", "resourceVersionMatch": "NotOlderThan"}  # fmt: skip


def streamed(server: FakeApiServer, path: str) -> list[int | None]:
    """The answers to the streaming lists asked for on `path`."""
    return [r.code for r in server.watches(path) if r.query.get("sendInitialEvents") == "true"]


def plain_watches_open(server: FakeApiServer) -> bool:
    """Both watches open, neither a streaming list."""
    return all(
        server.open_watches(path) == 1
        and server.watches(path)[-1].query.get("sendInitialEvents") is None
        for path in (NODES, CONFIGMAPS)
    )


def events(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_the_standin_ends_a_streaming_lists_initial_events_with_a_bookmark(
    server: FakeApiServer, http: httpx2.AsyncClient
) -> None:
    server.put_node("n1", {"a": "1"})
    server.time_scale = 1000.0  # the watch ends after 0.3 s
    answer = await http.get(NODES, params={**LISTING, "timeoutSeconds": "300"})
    added, end = events(answer.text)
    assert added["type"] == "ADDED"
    assert end == {
        "type": "BOOKMARK",
        "object": {
            "metadata": {
                "resourceVersion": str(server.version),
                "annotations": {INITIAL_EVENTS_END: "true"},
            }
        },
    }


@pytest.mark.parametrize(
    ("drop", "problem"),
    [("resourceVersionMatch", "resourceVersionMatch"), ("allowWatchBookmarks", "bookmarks")],
)
async def test_the_standin_refuses_a_streaming_list_without_its_companion_options(
    server: FakeApiServer, http: httpx2.AsyncClient, drop: str, problem: str
) -> None:
    query = {k: v for k, v in LISTING.items() if k != drop}
    answer = await http.get(NODES, params=query)
    assert answer.status_code == 422
    assert problem in answer.json()["message"]


async def test_over_etcd_3_4_the_standin_refuses_a_streaming_list_as_the_watch_cache_does(
    server: FakeApiServer, http: httpx2.AsyncClient
) -> None:
    """200, one ERROR event (a 500 InternalError Status), and the end."""
    server.put_node("n1", {"a": "1"})
    server.watch_lists_refused = STORAGE
    answer = await http.get(NODES, params=LISTING)
    assert answer.status_code == 200
    (error,) = events(answer.text)
    assert error["type"] == "ERROR"
    assert error["object"] == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Failure", "message": REFUSED_WATCH_LIST,
                               "reason": "InternalError", "code": 500}  # fmt: skip
    plain = {k: v for k, v in LISTING.items() if k not in ("sendInitialEvents",
                                                          "resourceVersionMatch")}  # fmt: skip
    server.time_scale = 1000.0
    served = await http.get(NODES, params={**plain, "timeoutSeconds": "300"})
    assert [e["type"] for e in events(served.text)] == ["ADDED"]  # a watch from now is served


async def test_after_a_restart_the_watch_from_now_is_a_streaming_list_resumed_from_its_end(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    server.put_node("n1", {"a": "1"})
    labels = Follower(api.watch_node_labels("n1"))
    try:
        await labels.next()
        await server.wait_for(lambda s: s.open_watches() == 1)
        await server.restart()
        await server.wait_for(lambda s: streamed(s, NODES) == [200] and s.open_watches() == 1)
        end = server.version  # the bookmark's
        server.end_watches()  # the server's timeout
        await server.wait_for(lambda s: len(s.watches()) == 4 and s.open_watches() == 1)
        assert server.watches()[-1].query.get("resourceVersion") == str(end)
    finally:
        await labels.close()


@pytest.mark.parametrize(
    "refusal", [STORAGE, 500, 422, 400], ids=["etcd-3.4", "http-500", "http-422", "http-400"]
)
async def test_a_refused_streaming_list_falls_back_to_a_plain_watch_from_now_at_once_and_for_good(
    server: FakeApiServer, api: KubeNodeApi, refusal: int | str
) -> None:
    """The node and ConfigMap watches both come back after one refused streaming list
    each, switches arrive through them (no re-read), and the next restart does not ask
    for a streaming list again."""
    server.put_node("n1", {"a": "1"})
    server.put_config_map(NS, CM, {"ts": "version: v1\n"})
    labels = Follower(api.watch_node_labels("n1"))
    views = Following(api.watch_config_map(NS, CM))
    try:
        await labels.next()
        await views.next()
        await server.wait_for(lambda s: s.open_watches(NODES) + s.open_watches(CONFIGMAPS) == 2)
        server.watch_lists_refused = refusal  # or a proxy, a feature gate: answered so
        await server.restart()
        await server.wait_for(plain_watches_open)
        for path in (NODES, CONFIGMAPS):
            assert len(streamed(server, path)) == 1  # asked once, refused, not again
        reads = len(server.of("GET", f"{NODES}/n1")) + len(server.of("GET", f"{CONFIGMAPS}/"))
        server.put_node("n1", {"a": "2"})
        server.put_config_map(NS, CM, {"ts": "version: v1\n", "ts-8": "version: v1\n"})
        assert await labels.next() == {"a": "2"}
        while (view := await views.next()).data != {"ts": "version: v1\n", "ts-8": "version: v1\n"}:
            assert view.trouble is not None or view.data == {"ts": "version: v1\n"}
        assert reads == len(server.of("GET", f"{NODES}/n1")) + len(
            server.of("GET", f"{CONFIGMAPS}/")
        )  # through the watches
        server.watch_lists_refused = None
        before = len(server.watches(NODES)), len(server.watches(CONFIGMAPS))
        await server.restart()
        await server.wait_for(
            lambda s: (
                plain_watches_open(s)
                and len(s.watches(NODES)) >= before[0] + 2
                and len(s.watches(CONFIGMAPS)) >= before[1] + 2
            )
        )
        assert all(len(streamed(server, path)) == 1 for path in (NODES, CONFIGMAPS))
    finally:
        await labels.close()
        await views.close()
