"""The owner references of the NodeFeature, against the API server stand-in: as upstream,
the agent's DaemonSet (as controller) and its Pod when a DaemonSet owns the Pod, none when
the Pod is owned otherwise; a Pod that cannot be read (missing, forbidden) leaves the object
without owners after one warning and publishing goes on; an update never touches them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from kube_fakes import FakeApiServer, fake_client, grants
from structlog.testing import capture_logs

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.adapters.kube.rbac import RULES
from gpuslice.core.errors import BackendError

NS = "gpu-ops"
POD = "gpuslice-x7k2p"
FEATURE = (NS, "nvidia-features-for-n1")
LABELS = {"nvidia.com/gpu.count": "4"}
DAEMONSET = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpuslice", "uid": "ds-1"}
REPLICASET = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "gpuslice-5d", "uid": "rs-1"}


@pytest.fixture
async def api(server: FakeApiServer, tmp_path: Path) -> AsyncIterator[KubeNodeApi]:
    client = fake_client(server.url, tmp_path)
    yield KubeNodeApi(client, pod_name=POD)
    await client.close()


@pytest.fixture
def warnings() -> Iterator[list[MutableMapping[str, Any]]]:
    saved = structlog.get_config()
    with capture_logs() as captured:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        yield captured
    structlog.configure(**saved)


def owners(server: FakeApiServer) -> list[dict[str, Any]] | None:
    refs: list[dict[str, Any]] | None = server.features[FEATURE]["metadata"].get("ownerReferences")
    return refs


async def test_a_pod_owned_by_a_daemonset_gives_the_daemonset_as_controller_and_the_pod(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    pod = server.put_pod(NS, POD, [{**DAEMONSET, "controller": True, "blockOwnerDeletion": True}])
    assert await api.publish_node_feature("n1", NS, LABELS) is True
    assert owners(server) == [
        {**DAEMONSET, "controller": True},
        {"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": pod["metadata"]["uid"]},
    ]


@pytest.mark.parametrize("pod_owners", [[REPLICASET], []], ids=["replicaset", "bare-pod"])
async def test_a_pod_not_owned_by_a_daemonset_gives_no_owner_references(
    server: FakeApiServer, api: KubeNodeApi, pod_owners: list[dict[str, str]]
) -> None:
    server.put_pod(NS, POD, pod_owners)
    assert await api.publish_node_feature("n1", NS, LABELS) is True
    assert owners(server) is None


@pytest.mark.parametrize("why", ["missing", "forbidden"])
async def test_an_unreadable_pod_gives_no_owners_one_warning_and_publishing_goes_on(
    server: FakeApiServer,
    tmp_path: Path,
    warnings: list[MutableMapping[str, Any]],
    why: str,
) -> None:
    if why == "forbidden":  # every rule but `pods get`
        server.grants = grants(NS, [r for r in RULES if "pods" not in r.resources])
    else:
        server.grants = grants(NS)
    client = fake_client(server.url, tmp_path)
    api = KubeNodeApi(client, pod_name=POD, recheck_s=(0.0, 0.0))  # re-read on each publish
    assert await api.publish_node_feature("n1", NS, LABELS) is True
    assert owners(server) is None
    del server.features[FEATURE]  # deleted by hand: created again, the Pod not asked again
    assert await api.publish_node_feature("n1", NS, LABELS) is True
    await client.close()
    assert len(server.of("GET", f"/pods/{POD}")) == 1
    (warning,) = warnings
    assert warning["event"] == "node_feature_no_owner"
    assert warning["error"].startswith(
        f"read pod {NS}/{POD}: HTTP {404 if why == 'missing' else 403}"
    )


async def test_a_transient_pod_read_failure_fails_the_write_which_is_retried_with_owners(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    server.put_pod(NS, POD, [{**DAEMONSET, "controller": True}])
    server.fail_next("GET", f"/pods/{POD}", 503)
    with pytest.raises(BackendError, match=r"read pod .*HTTP 503") as err:
        await api.publish_node_feature("n1", NS, LABELS)
    assert err.value.transient
    assert FEATURE not in server.features
    assert await api.publish_node_feature("n1", NS, LABELS) is True
    assert [o["kind"] for o in owners(server) or []] == ["DaemonSet", "Pod"]


async def test_an_update_keeps_the_stored_owner_references_as_they_are(
    server: FakeApiServer, api: KubeNodeApi
) -> None:
    """A restarted Pod must not re-add itself: changing owners on update needs `delete` on
    nodefeatures under OwnerReferencesPermissionEnforcement, which the agent is not granted."""
    server.put_pod(NS, POD, [{**DAEMONSET, "controller": True}])
    await api.publish_node_feature("n1", NS, LABELS)
    stored = server.features[FEATURE]["metadata"]
    stored["ownerReferences"] = stored["ownerReferences"][:1]  # the old Pod was collected
    assert await api.publish_node_feature("n1", NS, {"nvidia.com/gpu.count": "8"}) is True
    (update,) = server.of("PUT", "nodefeatures")
    assert update.body["metadata"]["ownerReferences"] == [{**DAEMONSET, "controller": True}]
    assert len(server.of("GET", "/pods/")) == 1  # looked up for the create only
