"""Watches after an API server restart, against the API server stand-in over real HTTP.

A restarted API server's watch cache starts at a new resourceVersion: a watch from an
older one is answered 410 Gone, and a single-object GET of an unchanged object still
gives its old version. The agent's watches must come back anyway (watching from now
after a 410 that follows a re-read), say they are down while they are, and resume no
faster than needed but within seconds of the server's return.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx2
from kube_fakes import FAST_BACKOFF, NODES, FakeApiServer, Follower, Following, fake_client

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.adapters.kube.watch import PROBE_CAP_S, Retry

NS = "gpu-operator"
CM = "gpuslice-configs"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"


def answered_410(server: FakeApiServer, path: str) -> int:
    return sum(r.code == 410 for r in server.watches(path))


async def test_the_standin_restarts_with_a_newer_watch_cache_and_lists_give_its_version(
    server: FakeApiServer, http: httpx2.AsyncClient
) -> None:
    """What the agent's fix relies on, as the real server does it."""
    old = server.put_node("n1", {"a": "1"})
    await server.restart()
    assert server.expired_below > int(old)
    node = (await http.get(f"{NODES}/n1")).json()
    assert node["metadata"]["resourceVersion"] == old  # an unchanged object keeps its version
    listed = (await http.get(NODES, params={"fieldSelector": "metadata.name=n1"})).json()
    assert int(listed["metadata"]["resourceVersion"]) >= server.expired_below
    assert [i["metadata"]["name"] for i in listed["items"]] == ["n1"]
    gone = await http.get(NODES, params={"watch": "true", "fieldSelector": "metadata.name=n1",
                                         "resourceVersion": old})  # fmt: skip
    assert gone.status_code == 410


async def test_node_and_configmap_watches_come_back_after_a_restart_with_nothing_changed(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    server.put_node("n1", {"a": "1"})
    server.put_config_map(NS, CM, {"ts": "version: v1\n"})
    labels = Follower(api.watch_node_labels("n1"))
    views = Following(api.watch_config_map(NS, CM))
    try:
        assert await labels.next() == {"a": "1"}
        await views.next()
        await server.wait_for(lambda s: s.open_watches(NODES) + s.open_watches(CONFIGMAPS) == 2)
        await server.restart()
        # both watches are open again, although every watch from an old version got 410
        await server.wait_for(
            lambda s: (
                s.open_watches(NODES) == 1
                and s.open_watches(CONFIGMAPS) == 1
                and answered_410(s, NODES) >= 1
                and answered_410(s, CONFIGMAPS) >= 1
            )
        )
        assert (await views.next()).trouble is not None  # said while down ...
        assert (await views.next()).trouble is None  # ... and cleared once back
        # and changes arrive through them, not through re-reads
        reads = len(server.of("GET", f"{NODES}/n1"))
        server.put_node("n1", {"a": "2"})
        server.put_config_map(NS, CM, {"ts": "version: v1\n", "ts-8": "version: v1\n"})
        assert await labels.next() == {"a": "2"}
        assert (await views.next()).data == {"ts": "version: v1\n", "ts-8": "version: v1\n"}
        assert len(server.of("GET", f"{NODES}/n1")) == reads
        assert answered_410(server, NODES) == 1  # one 410, then from now: no loop
    finally:
        await labels.close()
        await views.close()


async def test_watch_trouble_names_the_watches_down_while_the_server_is_away(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    server.put_node("n1", {"a": "1"})
    labels = Follower(api.watch_node_labels("n1"))
    try:
        await labels.next()
        await server.wait_for(lambda s: s.open_watches(NODES) == 1)
        assert api.watch_trouble is None
        down = asyncio.Event()
        restarting = asyncio.create_task(server.restart(down))
        for _ in range(200):
            if api.watch_trouble is not None:
                break
            await asyncio.sleep(0.01)
        assert api.watch_trouble is not None
        assert "watch of Node n1 down" in api.watch_trouble
        down.set()
        await restarting
        await server.wait_for(lambda s: s.open_watches(NODES) == 1)
        for _ in range(200):
            if api.watch_trouble is None:
                break
            await asyncio.sleep(0.01)
        assert api.watch_trouble is None
    finally:
        await labels.close()


def test_a_server_that_does_not_answer_is_probed_at_a_short_cap_one_that_answers_backs_off() -> (
    None
):
    """Recovery follows the server's return within seconds: a refused connection costs
    the server nothing, so it is retried within PROBE_CAP_S (full jitter); failures the
    server answered (5xx, 429, 403), with no outage before, still back off to the long
    cap."""
    away = Retry(0.2, 30.0, rand=random.Random(1))
    assert max(away.next_delay(unreachable=True) for _ in range(20)) <= PROBE_CAP_S * 1.2
    answered = Retry(0.2, 30.0, rand=random.Random(1))
    assert max(answered.next_delay() for _ in range(20)) >= 30.0 * 0.8
    # a fleet's reconnects after the outage: each agent at its own jittered time
    fleet = [Retry(0.2, 30.0, rand=random.Random(n)) for n in range(100)]
    last = [[r.next_delay(unreachable=True) for _ in range(10)][-1] for r in fleet]
    assert max(last) - min(last) > PROBE_CAP_S * 0.3


async def test_each_watch_asks_for_its_own_timeout_between_5_and_10_minutes(
    server: FakeApiServer, tmp_path: Path
) -> None:
    server.put_node("n1", {"a": "1"})
    client = fake_client(server.url, tmp_path)
    api = KubeNodeApi(client, backoff_s=FAST_BACKOFF, rand=random.Random(7))
    labels = Follower(api.watch_node_labels("n1"))
    try:
        await labels.next()
        for opened in range(2, 7):
            await server.wait_for(lambda s: s.open_watches(NODES) == 1)
            server.end_watches()  # each as the server's timeout ends it
            await server.wait_for(lambda s, n=opened: len(s.watches()) == n)
        timeouts = [int(w.query["timeoutSeconds"]) for w in server.watches()]
        assert all(300 <= t <= 600 for t in timeouts)
        assert len(set(timeouts)) > 1  # not in step with every other watch of the fleet
    finally:
        await labels.close()
        await client.close()


async def test_the_standin_ends_a_watch_after_its_timeout_scaled_for_accelerated_runs(
    server: FakeApiServer, http: httpx2.AsyncClient
) -> None:
    """As the real server, a watch ends cleanly after timeoutSeconds; `time_scale` makes
    that many server seconds pass in fewer real ones (the fleet bench's idle hour)."""
    server.put_node("n1")
    server.time_scale = 1000.0  # 300 s of the server's: 0.3 s
    query = {"watch": "true", "fieldSelector": "metadata.name=n1", "timeoutSeconds": "300"}
    async with asyncio.timeout(5):
        answer = await http.get(NODES, params=query)
    assert answer.status_code == 200
    assert [line.count('"ADDED"') for line in answer.text.splitlines()] == [1]


async def test_watches_reopen_promptly_once_a_server_back_from_an_outage_has_its_cache_ready(
    server: FakeApiServer, tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    """Away long enough for the probes to pile up failures, then back with its watch
    cache filling (watches answered 429, as a starting API server does): once the cache
    is ready both watches reopen within a few probe caps (0.1 s here). Counted on from
    the outage's failures on the 30 s schedule, as before, the wait was 24 s or more."""
    server.put_node("n1", {"a": "1"})
    server.put_config_map(NS, CM, {"ts": "version: v1\n"})
    client = fake_client(server.url, tmp_path)
    api = KubeNodeApi(client, backoff_s=(0.05, 30.0), probe_cap_s=0.1)
    labels = Follower(api.watch_node_labels("n1"))
    views = Following(api.watch_config_map(NS, CM))
    both_open = lambda s: s.open_watches(NODES) == 1 and s.open_watches(CONFIGMAPS) == 1  # noqa: E731
    try:
        await labels.next()
        await views.next()
        await server.wait_for(both_open)
        down, warming = asyncio.Event(), asyncio.Event()
        restarting = asyncio.create_task(server.restart(down, warming))
        await asyncio.sleep(1.0)  # the outage: about ten refused probes per watch
        down.set()
        await restarting
        answer = await http.get(NODES, params={"watch": "true"})
        assert (answer.status_code, answer.headers.get("retry-after")) == (429, "1")
        told = lambda s, path: sum(r.code == 429 for r in s.watches(path))  # noqa: E731
        await server.wait_for(lambda s: told(s, NODES) >= 2)  # this test's, the agent's
        reads = len(server.of("GET", f"{NODES}/n1"))
        await server.wait_for(lambda s: told(s, CONFIGMAPS) >= 2 and told(s, NODES) >= 4)
        assert len(server.of("GET", f"{NODES}/n1")) == reads  # asked again, not re-read
        loop = asyncio.get_running_loop()
        ready = loop.time()
        warming.set()
        await server.wait_for(both_open)
        assert loop.time() - ready < 2.0
    finally:
        await labels.close()
        await views.close()
        await client.close()
