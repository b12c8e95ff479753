"""Answers from a broken API server: bytes that are not JSON and bodies that say gzip and
are not, on reads and on watches. Each read is a one-line transient BackendError; a
running agent with its configs from the API (--config-map) keeps serving the last good
config, retries with backoff, says why in readiness, and applies the edit made meanwhile
once the answers are good again. Hypothesis feeds the watch-line decoder any bytes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import GPU, serving
from hypothesis import given, settings
from hypothesis import strategies as st
from node_harness import NAMESPACE, NODE, time_slicing
from test_node_configmap_api import CM, Cluster, cluster, no_proxy

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.adapters.kube.bounded import MAX_ANSWER_BYTES
from gpuslice.adapters.kube.session import MAX_EVENT_BYTES, _decode_event, _lines, make_client
from gpuslice.adapters.kube.watch import WatchBroken, WatchGone
from gpuslice.core.errors import BackendError
from gpuslice.testing.apiserver import (
    BAD_GZIP,
    GARBAGE,
    GZIP_BOMB,
    FakeApiServer,
    write_kubeconfig,
)
from gpuslice.testing.kubelet import KubeletStandin

from .invariant import RSS_GROWTH_LIMIT, answers_allocate, rss_bytes

__all__ = ["cluster", "no_proxy"]  # fixtures used here


@pytest.fixture
async def api(tmp_path: Path, no_proxy: None) -> AsyncIterator[tuple[FakeApiServer, KubeNodeApi]]:
    async with FakeApiServer() as server:
        server.put_node(NODE)
        server.put_config_map(NAMESPACE, CM, {"a": "version: v1\n"})
        client = make_client(write_kubeconfig(tmp_path, server.url))
        yield server, KubeNodeApi(client, backoff_s=(0.01, 0.05))
        await client.close()


@pytest.mark.parametrize("how", [GARBAGE, BAD_GZIP])
async def test_a_broken_answer_to_a_read_is_a_one_line_transient_error(
    api: tuple[FakeApiServer, KubeNodeApi], how: str
) -> None:
    server, kube = api
    server.corrupt_next("GET", f"/nodes/{NODE}", how)
    with pytest.raises(BackendError) as err:
        await kube.node_labels(NODE)
    assert err.value.transient
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"read node {NODE}: ")
    assert await kube.node_labels(NODE) == {}  # the next answer is read as usual


@pytest.mark.parametrize(
    "how", [GZIP_BOMB, b" " * (MAX_ANSWER_BYTES + 1)], ids=["gzip-bomb", "over-the-bound"]
)
async def test_an_answer_past_the_bound_is_refused_without_growing(
    api: tuple[FakeApiServer, KubeNodeApi], how: str | bytes
) -> None:
    server, kube = api
    await kube.node_labels(NODE)  # the client's own first-use allocations
    before = rss_bytes()
    server.corrupt_next("GET", f"/nodes/{NODE}", how)
    with pytest.raises(BackendError) as err:
        await kube.node_labels(NODE)
    assert err.value.transient
    assert "\n" not in str(err.value)
    assert f"over {MAX_ANSWER_BYTES} bytes" in str(err.value)
    assert rss_bytes() - before < RSS_GROWTH_LIMIT
    assert await kube.node_labels(NODE) == {}  # the next answer is read as usual


@pytest.mark.parametrize("how", [GARBAGE, BAD_GZIP])
async def test_a_broken_watch_answer_is_retried_and_the_watch_goes_on(
    api: tuple[FakeApiServer, KubeNodeApi], how: str
) -> None:
    server, kube = api
    views = kube.watch_config_map(NAMESPACE, CM)
    first = await anext(views)
    assert first.data == {"a": "version: v1\n"}
    server.corrupt_next("GET", f"/namespaces/{NAMESPACE}/configmaps", how)
    server.drop_watches()  # the next watch request meets the broken answer
    troubled = await anext(views)
    assert troubled.trouble is not None
    assert "\n" not in troubled.trouble
    server.put_config_map(NAMESPACE, CM, {"a": "version: v1\n", "b": "version: v1\n"})
    while (await anext(views)).data != {"a": "version: v1\n", "b": "version: v1\n"}:
        pass
    await views.aclose()  # type: ignore[attr-defined]


async def test_the_agent_keeps_serving_through_broken_answers_and_says_why(
    kubelet: KubeletStandin, cluster: Cluster
) -> None:
    server = cluster.server
    rss = rss_bytes()
    reads = len(server.of("GET", "configmaps"))
    for how in (GARBAGE, BAD_GZIP, GARBAGE, BAD_GZIP):
        server.corrupt_next("GET", f"/namespaces/{NAMESPACE}/configmaps", how)
    server.expire_watches()  # a full re-read, then a new watch: both meet broken answers
    await cluster.settles(lambda: "source" in cluster.config())
    assert "\n" not in cluster.config()["source"]
    assert cluster.config()["config"] == "ts-4"
    await answers_allocate(kubelet)
    cluster.edit({"ts-4": time_slicing(2)})
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}), 10)
    await cluster.settles(lambda: "source" not in cluster.config())
    assert len(server.of("GET", "configmaps")) >= reads + 5  # each broken answer retried
    assert rss_bytes() - rss < RSS_GROWTH_LIMIT


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _all_lines(parts: list[bytes], limit: int) -> list[bytes]:
    return [line async for line in _lines(_chunks(parts), limit)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=10))
def test_any_bytes_on_a_watch_end_as_events_or_one_line_broken_watch(parts: list[bytes]) -> None:
    errors: list[str] = []
    try:
        lines = asyncio.run(_all_lines(parts, 64))
    except WatchBroken as exc:
        lines, errors = [], [str(exc)]
        assert len(b"".join(parts)) > 64
    if not errors:
        assert [ln for ln in b"".join(parts).split(b"\n") if ln.strip()] == lines
    for line in lines:
        try:
            assert isinstance(_decode_event(line, lambda obj: obj).type, str)
        except (WatchBroken, WatchGone) as exc:
            errors.append(str(exc))
    assert all("\n" not in e for e in errors)


def test_a_line_without_end_never_grows_past_the_limit() -> None:
    parts = [b"x" * 65536] * 300  # 19 MiB, no newline
    with pytest.raises(WatchBroken, match=f"over {MAX_EVENT_BYTES} bytes"):
        asyncio.run(_all_lines(parts, MAX_EVENT_BYTES))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
_bodies = st.one_of(
    st.binary(max_size=300),
    _json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"kind": st.just("ConfigMap"), "metadata": _json_values, "data": _json_values}
    ).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth),
)


async def test_any_answer_to_a_read_is_a_value_or_a_one_line_transient_error(
    api: tuple[FakeApiServer, KubeNodeApi],
) -> None:
    server, kube = api
    loop = asyncio.get_running_loop()
    outcomes: list[str] = []

    async def read(body: bytes) -> str:
        server.corrupt_next("GET", f"/configmaps/{CM}", body)
        try:
            state, _uid = await kube._session.read_config_map(NAMESPACE, CM)
        except BackendError as exc:
            return f"error transient={exc.transient} {exc}"
        assert isinstance(state.value.data, dict | None)
        return "read"

    @settings(max_examples=150, deadline=None)
    @given(_bodies)
    def one(body: bytes) -> None:
        outcomes.append(asyncio.run_coroutine_threadsafe(read(body), loop).result(10))

    await asyncio.to_thread(one)
    errors = [o for o in outcomes if o.startswith("error")]
    assert errors
    assert all(e.startswith("error transient=True ") and "\n" not in e for e in errors)
    state, _uid = await kube._session.read_config_map(NAMESPACE, CM)
    assert state.value.data == {"a": "version: v1\n"}
