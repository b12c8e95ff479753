"""KubeNodeApi's reads and writes against a real HTTP fake of the API server.

NodeFeature create/update/skip counted server-side, Events, error messages, the
kubeconfig path and the lazy lightkube import. The watch has test_kube_watch.py.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kube_fakes import FAST_BACKOFF, FakeApiServer, Follower, fake_client, write_kubeconfig

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.config.options import resolve_options
from gpuslice.core.errors import BackendError
from gpuslice.wiring.node import node_api

NS = "gpu-ops"
FEATURE = ("gpu-ops", "nvidia-features-for-n1")
LABELS = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "Tesla-T4"}


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    srv = FakeApiServer()
    await srv.start()
    srv.put_node("n1", {"kubernetes.io/hostname": "n1"})
    yield srv
    await srv.close()


def writes(server: FakeApiServer) -> int:
    return len(server.of("POST", "nodefeatures")) + len(server.of("PUT", "nodefeatures"))


async def test_node_labels_is_a_full_read(server: FakeApiServer, api: KubeNodeApi) -> None:
    assert await api.node_labels("n1") == {"kubernetes.io/hostname": "n1"}
    assert [(r.method, r.path) for r in server.requests] == [("GET", "/api/v1/nodes/n1")]


async def test_node_labels_of_a_missing_node_is_a_one_line_error(api: KubeNodeApi) -> None:
    with pytest.raises(BackendError, match=r"^node n9 not found in the Kubernetes API$") as err:
        await api.node_labels("n9")
    assert not err.value.transient


async def test_node_feature_created_once_then_written_only_when_labels_change(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    assert await api.publish_node_feature("n1", NS, LABELS) is True
    stored = server.features[FEATURE]
    assert stored["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    assert stored["kind"] == "NodeFeature"
    assert stored["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "n1"}
    assert "ownerReferences" not in stored["metadata"]
    assert stored["spec"] == {
        "features": {"flags": {}, "attributes": {}, "instances": {}},
        "labels": LABELS,
    }
    assert server.of("POST", f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{NS}/nodefeatures")

    assert await api.publish_node_feature("n1", NS, dict(LABELS)) is False
    assert writes(server) == 1  # read, compared, nothing sent

    changed = {**LABELS, "nvidia.com/gpu.replicas": "4"}
    assert await api.publish_node_feature("n1", NS, changed) is True
    assert len(server.of("PUT", f"nodefeatures/{FEATURE[1]}")) == 1
    assert server.features[FEATURE]["spec"]["labels"] == changed
    assert server.features[FEATURE]["metadata"]["labels"] == stored["metadata"]["labels"]
    assert writes(server) == 2


async def test_node_feature_update_is_retried_after_a_conflict(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    await api.publish_node_feature("n1", NS, LABELS)
    server.fail_next("PUT", "nodefeatures", 409)
    assert await api.publish_node_feature("n1", NS, {"x": "1"}) is True
    assert len(server.of("PUT", "nodefeatures")) == 2
    assert server.features[FEATURE]["spec"]["labels"] == {"x": "1"}


async def test_node_feature_write_refused_is_a_one_line_backend_error(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    server.fail_next("POST", "nodefeatures", 403)
    with pytest.raises(BackendError, match=r"create NodeFeature gpu-ops/.*HTTP 403") as err:
        await api.publish_node_feature("n1", NS, LABELS)
    assert not err.value.transient
    assert "\n" not in str(err.value)


async def test_event_names_the_node_as_involved_object(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    await api.node_labels("n1")  # the uid is learnt from reads
    await api.record_event("n1", "ConfigInvalid", "config t4: replicas must be >= 2", warning=True)
    (request,) = server.of("POST", "/api/v1/namespaces/default/events")
    event = request.body
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "n1",
        "uid": server.nodes["n1"]["metadata"]["uid"],
    }
    assert (event["type"], event["reason"]) == ("Warning", "ConfigInvalid")
    assert event["message"] == "config t4: replicas must be >= 2"
    assert event["source"] == {"component": "gpuslice", "host": "n1"}
    assert event["metadata"]["generateName"] == "n1."
    assert event["firstTimestamp"] == event["lastTimestamp"]


async def test_event_failure_is_swallowed(server: FakeApiServer, api: KubeNodeApi) -> None:
    server.fail_next("POST", "events", 500)
    await api.record_event("n1", "ConfigApplied", "now serving t4", warning=False)
    assert len(server.of("POST", "events")) == 1
    assert server.events == []


async def test_unreachable_server_gives_a_one_line_transient_error(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    client = fake_client(url, tmp_path)
    api = KubeNodeApi(client, backoff_s=FAST_BACKOFF)
    for call in (api.node_labels("n1"), api.publish_node_feature("n1", NS, LABELS)):
        with pytest.raises(BackendError, match=f"Kubernetes API at {url}/? unreachable") as err:
            await call
        assert err.value.transient
        assert "\n" not in str(err.value)
    follower = Follower(api.watch_node_labels("n1"))
    with pytest.raises(BackendError, match="unreachable"):
        await follower.next()
    await api.record_event("n1", "ConfigApplied", "x", warning=False)  # never raises
    await client.close()


async def test_kubeconfig_path_builds_the_client(
    server: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for proxy in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    api = KubeNodeApi(kubeconfig=write_kubeconfig(tmp_path, server.url))
    assert api.server == server.url
    assert await api.node_labels("n1") == {"kubernetes.io/hostname": "n1"}
    await api.aclose()


def test_an_unusable_kubeconfig_is_a_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(BackendError, match=f"^--kubeconfig \\(KUBECONFIG\\) {missing}: "):
        KubeNodeApi(kubeconfig=str(missing))


def test_importing_the_adapter_loads_no_lightkube() -> None:
    """`gpuslice run` without Kubernetes must not pay lightkube's import time."""
    probe = (
        "import sys, gpuslice.adapters.kube, gpuslice.testing.nodeapi as m; m.MemoryNodeApi(); "
        "print(sorted(m for m in ('lightkube', 'httpx2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_node_events_of_an_agent_in_its_own_namespace_land_in_default(
    server: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server refuses an Event about a Node outside namespace default (422), so the
    agent, wired as `gpuslice run` wires it in a DaemonSet's namespace, writes it there."""
    for proxy in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    cli = {"node-name": "n1", "namespace": NS, "kubeconfig": write_kubeconfig(tmp_path, server.url)}
    api = node_api(resolve_options(cli))
    assert api is not None
    await api.record_event("n1", "ConfigRejected", "config rejected, keeping ts-4", warning=True)
    await api.aclose()
    assert [r.code for r in server.of("POST", "events")] == [201]
    (event,) = server.events
    assert (event["metadata"]["namespace"], event["reason"]) == ("default", "ConfigRejected")
