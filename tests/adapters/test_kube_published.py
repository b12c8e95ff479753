"""The NodeFeature is not read back while the labels this agent wrote are still the ones it
wants: only it writes the object, so an idle agent makes no request for it, except a
slow re-check at a jittered interval (10-20 min) that finds someone else's edit or
deletion. A changed label set or a failed write reads the object again."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kube_fakes import NFD, FakeApiServer, fake_client

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.core.errors import BackendError

NS = "gpu-operator"
FEATURE = (NS, "nvidia-features-for-n1")
FOUR = {"nvidia.com/gpu.replicas": "4"}
EIGHT = {"nvidia.com/gpu.replicas": "8"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def api(server: FakeApiServer, tmp_path: Path, clock: Clock) -> AsyncIterator[KubeNodeApi]:
    client = fake_client(server.url, tmp_path)
    yield KubeNodeApi(client, clock=clock, rand=random.Random(3))
    await client.close()


def requests(server: FakeApiServer) -> list[str]:
    return [r.method for r in server.requests if r.path.startswith(NFD)]


async def test_unchanged_labels_make_no_request_until_the_slow_recheck(
    server: FakeApiServer, api: KubeNodeApi, clock: Clock
) -> None:
    assert await api.publish_node_feature("n1", NS, FOUR)
    assert requests(server) == ["GET", "POST"]
    for _ in range(59):  # labelling every 10 s for almost 10 min: before any re-check
        clock.now += 10.0
        assert not await api.publish_node_feature("n1", NS, FOUR)
    assert requests(server) == ["GET", "POST"]
    clock.now += 1200.0  # past any re-check (10-20 min)
    assert not await api.publish_node_feature("n1", NS, FOUR)
    assert requests(server) == ["GET", "POST", "GET"]  # read, found as written: no write
    assert not await api.publish_node_feature("n1", NS, FOUR)
    assert requests(server) == ["GET", "POST", "GET"]


async def test_the_recheck_finds_an_edit_by_someone_else_and_a_change_is_written(
    server: FakeApiServer, api: KubeNodeApi, clock: Clock
) -> None:
    await api.publish_node_feature("n1", NS, FOUR)
    server.features[FEATURE]["spec"]["labels"] = {"edited": "by hand"}
    assert not await api.publish_node_feature("n1", NS, FOUR)  # not due yet: not seen
    clock.now += 1200.0
    assert await api.publish_node_feature("n1", NS, FOUR)  # due: read, and put back
    assert server.features[FEATURE]["spec"]["labels"] == FOUR
    assert await api.publish_node_feature("n1", NS, EIGHT)  # a change reads and writes at once
    assert server.features[FEATURE]["spec"]["labels"] == EIGHT
    assert requests(server) == ["GET", "POST", "GET", "PUT", "GET", "PUT"]


async def test_a_failed_write_is_not_held_the_next_publish_reads_again(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    await api.publish_node_feature("n1", NS, FOUR)
    server.fail_next("PUT", NFD, 503)
    with pytest.raises(BackendError):
        await api.publish_node_feature("n1", NS, EIGHT)
    assert await api.publish_node_feature("n1", NS, EIGHT)
    assert requests(server) == ["GET", "POST", "GET", "PUT", "GET", "PUT"]
    assert server.features[FEATURE]["spec"]["labels"] == EIGHT


def test_rechecks_are_spread_between_10_and_20_minutes(clock: Clock) -> None:
    from gpuslice.adapters.kube.published import Published

    rand = random.Random(1)
    held = Published(clock, lambda: rand.uniform(600.0, 1200.0))
    dues = []
    for node in range(50):
        held.hold(node, FOUR)
        low, high = 0.0, 1300.0
        while high - low > 1.0:  # when does it stop holding?
            clock.now, mid = 1000.0 + (low + high) / 2, (low + high) / 2
            low, high = (mid, high) if held.holds(node, FOUR) else (low, mid)
        clock.now = 1000.0
        dues.append(low)
    assert all(599.0 <= due <= 1201.0 for due in dues)
    assert max(dues) - min(dues) > 300.0
