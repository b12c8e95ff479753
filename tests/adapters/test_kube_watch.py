"""KubeNodeApi.watch_node_labels against a real HTTP fake of the API server.

The server is a tiny asyncio HTTP/1.1 server on 127.0.0.1 (kube_fakes.FakeApiServer)
rather than an httpx2.MockTransport: the watch is a long-lived chunked response
whose connection must be able to end cleanly, die mid-stream or be refused, and
only real sockets show how lightkube and httpx2 react to each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from kube_fakes import FAST_BACKOFF, TOKEN, FakeApiServer, Follower, fake_client

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.core.errors import BackendError

NODE_GET = "/api/v1/nodes/n1"


@pytest.fixture
async def follow(server: FakeApiServer, tmp_path: Path) -> AsyncIterator[Callable[[], Follower]]:
    """Start following n1's labels; every follower and the client close at teardown."""
    client = fake_client(server.url, tmp_path)
    api = KubeNodeApi(client, backoff_s=FAST_BACKOFF)
    followers: list[Follower] = []

    def start() -> Follower:
        followers.append(Follower(api.watch_node_labels("n1")))
        return followers[-1]

    yield start
    for follower in followers:
        await follower.close()
    await client.close()


async def watching(server: FakeApiServer, requests: int) -> None:
    """Wait until `requests` watch requests arrived and one watch is open."""
    await server.wait_for(lambda s: len(s.watches()) == requests and s.open_watches() == 1)


async def test_first_yield_is_the_full_read_and_the_watch_starts_from_its_version(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    version = server.put_node("n1", {"a": "1"})
    labels = await follow().next()
    await watching(server, 1)
    assert labels == {"a": "1"}
    read, watch = server.requests
    assert (read.method, read.path) == ("GET", NODE_GET)
    assert watch.is_watch
    timeout = watch.query.pop("timeoutSeconds")
    assert watch.query == {
        "watch": "true",
        "fieldSelector": "metadata.name=n1",
        "resourceVersion": version,
        "allowWatchBookmarks": "true",
    }
    assert 300 <= int(timeout) <= 600  # drawn anew for each watch, as client-go does
    assert watch.headers["authorization"] == f"Bearer {TOKEN}"


async def test_label_change_yields_once_and_an_annotation_change_yields_nothing(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    server.put_node("n1", {"a": "1"})
    follower = follow()
    await follower.next()
    await watching(server, 1)
    server.put_node("n1", {"a": "1"}, {"note": "unrelated"})
    server.put_node("n1", {"a": "2"}, {"note": "unrelated"})
    server.put_node("n1", {"a": "2"}, {"note": "again"})
    server.put_node("n1", {"a": "3"})
    assert await follower.next() == {"a": "2"}
    assert await follower.next() == {"a": "3"}
    assert follower.pending() == 0


async def test_a_bookmark_moves_the_version_a_clean_reconnect_resumes_from(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    server.put_node("n1", {"a": "1"})
    await follow().next()
    await watching(server, 1)
    mark = server.bookmark()
    server.end_watches()  # the server's timeoutSeconds ran out
    await watching(server, 2)
    assert server.watches()[1].query["resourceVersion"] == mark
    assert len(server.of("GET", NODE_GET)) == 1  # resumed without a re-read


async def test_410_gone_event_rereads_and_resumes_from_the_new_version(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    server.put_node("n1", {"a": "1"})
    follower = follow()
    await follower.next()
    await watching(server, 1)
    missed = server.put_node("n1", {"a": "2"}, notify=False)  # only a re-read sees it
    server.expire_watches()
    assert await follower.next() == {"a": "2"}
    await watching(server, 2)
    assert len(server.of("GET", NODE_GET)) == 2
    assert server.watches()[1].query["resourceVersion"] == missed
    server.put_node("n1", {"a": "3"})
    assert await follower.next() == {"a": "3"}


async def test_410_gone_http_status_on_resume_rereads(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    first = server.put_node("n1", {"a": "1"})
    follower = follow()
    await follower.next()
    await watching(server, 1)
    missed = server.put_node("n1", {"a": "2"}, notify=False)
    server.expired_below = int(missed)  # history before the change is compacted
    server.end_watches()
    assert await follower.next() == {"a": "2"}
    await watching(server, 3)
    versions = [w.query["resourceVersion"] for w in server.watches()]
    assert versions == [first, first, missed]  # the second got HTTP 410
    assert len(server.of("GET", NODE_GET)) == 2


async def test_a_dropped_connection_is_retried_through_a_failing_reread(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    server.put_node("n1", {"a": "1"})
    follower = follow()
    await follower.next()
    await watching(server, 1)
    server.put_node("n1", {"a": "2"}, notify=False)
    server.fail_next("GET", NODE_GET, 503)
    server.drop_watches()  # the socket dies mid-stream
    assert await follower.next() == {"a": "2"}
    await watching(server, 2)
    assert len(server.of("GET", NODE_GET)) == 3  # first read, the 503, the good re-read


async def test_a_deleted_node_yields_empty_labels_and_its_recreation_its_labels(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    server.put_node("n1", {"a": "1"})
    follower = follow()
    await follower.next()
    await watching(server, 1)
    server.delete_node("n1")
    assert await follower.next() == {}
    server.put_node("n1", {"b": "1"})
    assert await follower.next() == {"b": "1"}


async def test_a_missing_node_starts_empty_and_is_watched_from_now(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    follower = follow()
    assert await follower.next() == {}
    await watching(server, 1)
    assert "resourceVersion" not in server.watches()[0].query
    server.put_node("n1", {"a": "1"})
    assert await follower.next() == {"a": "1"}


async def test_the_first_read_failing_ends_the_watch_with_a_backend_error(
    server: FakeApiServer, follow: Callable[[], Follower]
) -> None:
    server.fail_next("GET", NODE_GET, 403)
    with pytest.raises(BackendError, match="read node n1: HTTP 403") as caught:
        await follow().next()
    assert not caught.value.transient
    assert not server.watches()
