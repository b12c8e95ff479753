"""The API server stand-in (gpuslice.testing.apiserver) answers as a real API server does
where the agent's correctness depends on it: 422 for a Node Event outside namespace
default, 403 with the authorizer's wording for what no grant covers, 404 for NodeFeatures
while NFD's CRD is missing. Checked through lightkube, the client the agent uses."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from kube_fakes import FakeApiServer, Grant, fake_client
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node

from gpuslice.adapters.kube.session import NodeFeature
from gpuslice.testing.apiserver import Access, access_of, write_kubeconfig

NS = "gpu-ops"


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as srv:
        srv.put_node("n1")
        yield srv


@pytest.fixture
async def client(server: FakeApiServer, tmp_path: Path) -> AsyncIterator[AsyncClient]:
    client = fake_client(server.url, tmp_path)
    yield client
    await client.close()


def event(namespace: str, kind: str, name: str, involved_ns: str | None = None) -> Event:
    return Event(
        metadata=ObjectMeta(generateName=f"{name}.", namespace=namespace),
        involvedObject=ObjectReference(kind=kind, name=name, namespace=involved_ns),
        reason="Test",
        message="m",
    )


async def test_an_event_about_a_node_is_accepted_only_in_namespace_default(
    server: FakeApiServer, client: AsyncClient
) -> None:
    with pytest.raises(ApiError) as err:
        await client.create(event(NS, "Node", "n1"))
    status = err.value.status
    assert (status.code, status.reason) == (422, "Invalid")
    assert status.message is not None
    assert status.message.startswith('Event "n1.')
    assert status.message.endswith(
        'is invalid: involvedObject.namespace: Invalid value: "": does not match event.namespace'
    )
    assert server.events == []
    await client.create(event("default", "Node", "n1"))
    await client.create(event(NS, "Pod", "p1", involved_ns=NS))  # beside its namespaced object
    assert [e["metadata"]["namespace"] for e in server.events] == ["default", NS]


async def test_a_request_no_grant_covers_is_forbidden_in_the_authorizers_words(
    server: FakeApiServer, client: AsyncClient
) -> None:
    server.grants = [Grant("", frozenset({"nodes"}), frozenset({"get"}))]
    assert (await client.get(Node, "n1")).metadata is not None
    with pytest.raises(ApiError) as err:
        await client.get(NodeFeature, "nvidia-features-for-n1", namespace=NS)
    assert (err.value.status.code, err.value.status.reason) == (403, "Forbidden")
    assert err.value.status.message == (
        'nodefeatures.nfd.k8s-sigs.io "nvidia-features-for-n1" is forbidden: User '
        '"system:serviceaccount:gpu-operator:gpuslice" cannot get resource "nodefeatures" in '
        'API group "nfd.k8s-sigs.io" in the namespace "gpu-ops"'
    )
    with pytest.raises(ApiError, match=r'^nodes is forbidden: .* cannot list resource "nodes" '
                       r'in API group "" at the cluster scope$'):  # fmt: skip
        async for _ in client.list(Node):
            pass
    assert [r.code for r in server.requests] == [200, 403, 403]


async def test_a_namespaced_grant_covers_its_namespace_only(
    server: FakeApiServer, client: AsyncClient
) -> None:
    server.grants = [Grant("", frozenset({"events"}), frozenset({"create"}), "default")]
    await client.create(event("default", "Node", "n1"))
    with pytest.raises(ApiError, match='cannot create resource "events" in API group "" in '
                       'the namespace "gpu-ops"'):  # fmt: skip
        await client.create(event(NS, "Pod", "p1", involved_ns=NS))


async def test_nodefeatures_are_unknown_while_nfd_is_not_installed(
    server: FakeApiServer, client: AsyncClient
) -> None:
    server.nfd_installed = False
    meta = ObjectMeta(name="nvidia-features-for-n1", namespace=NS)
    for call in (
        client.get(NodeFeature, "nvidia-features-for-n1", namespace=NS),
        client.create(NodeFeature(metadata=meta, spec={})),
    ):
        with pytest.raises(ApiError) as err:
            await call
        assert err.value.status.code == 404
        assert err.value.status.message == "the server could not find the requested resource"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/nodes/n1", {}, Access("get", "", "nodes", "", "n1")),
        ("GET", "/api/v1/nodes", {"watch": "true"}, Access("watch", "", "nodes", "", "")),
        ("GET", "/api/v1/nodes", {}, Access("list", "", "nodes", "", "")),
        ("POST", "/api/v1/namespaces/default/events", {},
         Access("create", "", "events", "default", "")),
        ("PUT", "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/x/nodefeatures/f", {},
         Access("update", "nfd.k8s-sigs.io", "nodefeatures", "x", "f")),
        ("PATCH", "/api/v1/namespaces/x/pods/p/status", {},
         Access("patch", "", "pods/status", "x", "p")),
        ("GET", "/api/v1/namespaces/x", {}, Access("get", "", "namespaces", "", "x")),
        ("GET", "/version", {}, None),
    ],
)  # fmt: skip
def test_requests_map_to_the_authorizers_attributes(
    method: str, path: str, query: dict[str, str], expected: Access | None
) -> None:
    assert access_of(method, path, query) == expected


def test_the_standin_needs_only_the_standard_library() -> None:
    """The testing kit ships in the package: importing it loads no third-party module."""
    probe = (
        "import sys; before = set(sys.modules); import gpuslice.testing.apiserver; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new - set(sys.stdlib_module_names)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['gpuslice']"


async def test_a_late_server_answers_past_a_client_timeout_until_it_is_on_time_again(
    server: FakeApiServer, client: AsyncClient, tmp_path: Path
) -> None:
    """answer_late holds every request (a loaded server): a client that waits less times
    out as against a real one; on_time lets the held requests through at once."""
    config = KubeConfig.from_file(write_kubeconfig(tmp_path, server.url))
    impatient = AsyncClient(config=config, trust_env=False, timeout=httpx2.Timeout(0.2))
    server.answer_late(60.0)
    try:
        with pytest.raises(httpx2.ReadTimeout):
            await impatient.get(Node, "n1")
        held = asyncio.ensure_future(client.get(Node, "n1"))  # waits up to 10 s
        await server.wait_for(lambda s: len(s.of("GET", "/nodes/n1")) == 2)
        assert not held.done()
        server.on_time()
        assert (await held).metadata.name == "n1"
        assert (await impatient.get(Node, "n1")).metadata.name == "n1"
    finally:
        await impatient.close()
