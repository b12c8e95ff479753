"""Names and bodies of the objects the agent writes: the NFD NodeFeature and Node Events.

Pure dictionaries in the JSON shape the API server stores, shared by the
lightkube adapter and the in-memory stand-in so both hold identical objects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gpuslice.core.labels import labels_changed

NFD_GROUP = "nfd.k8s-sigs.io"
NFD_VERSION = "v1alpha1"
NODE_FEATURE_KIND = "NodeFeature"
NODE_FEATURE_PLURAL = "nodefeatures"
NODE_FEATURE_PREFIX = "nvidia-features-for-"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
DRA_GROUP = "resource.k8s.io"
AUTHN_GROUP = "authentication.k8s.io"  # TokenReview
AUTHZ_GROUP = "authorization.k8s.io"  # SubjectAccessReview
COMPONENT = "gpuslice"
EVENT_NORMAL = "Normal"
EVENT_WARNING = "Warning"
# The API server keeps an Event about a cluster-scoped object (a Node) only in "default".
NODE_EVENT_NAMESPACE = "default"


class Identity(NamedTuple):
    """Whom a bearer token authenticates, as a TokenReview answers it."""

    user: str
    uid: str
    groups: tuple[str, ...]
    extra: Mapping[str, Sequence[str]]


class OwnerRef(NamedTuple):
    """One entry of metadata.ownerReferences (garbage collection of the NodeFeature)."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False

    def to_json(self) -> dict[str, Any]:
        ref: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
        }
        if self.controller:
            ref["controller"] = True
        return ref


def daemonset_owners(pod: str, pod_uid: str, refs: Sequence[Mapping[str, Any]]) -> list[OwnerRef]:
    """The NodeFeature's owners, as upstream sets them: the DaemonSet that owns the agent's
    Pod (as controller) and the Pod itself; none when no DaemonSet owns the Pod."""
    for ref in refs:
        if ref.get("kind") == "DaemonSet":
            owner = OwnerRef(ref["apiVersion"], "DaemonSet", ref["name"], ref["uid"], True)
            return [owner, OwnerRef("v1", "Pod", pod, pod_uid)]
    return []


def node_feature_name(node: str) -> str:
    return NODE_FEATURE_PREFIX + node


def node_feature_body(
    node: str,
    namespace: str,
    labels: Mapping[str, str],
    owners: Sequence[OwnerRef] = (),
) -> dict[str, Any]:
    """A new NodeFeature for `node`: its labels requested, no raw features."""
    metadata: dict[str, Any] = {
        "name": node_feature_name(node),
        "namespace": namespace,
        "labels": {NODE_NAME_LABEL: node},
    }
    if owners:
        metadata["ownerReferences"] = [owner.to_json() for owner in owners]
    return {
        "apiVersion": f"{NFD_GROUP}/{NFD_VERSION}",
        "kind": NODE_FEATURE_KIND,
        "metadata": metadata,
        "spec": {
            "features": {"flags": {}, "attributes": {}, "instances": {}},
            "labels": dict(labels),
        },
    }


def spec_labels(body: Mapping[str, Any]) -> dict[str, str]:
    """spec.labels of a stored NodeFeature ({} when absent or null)."""
    spec = body.get("spec") or {}
    return dict(spec.get("labels") or {})


def holds(body: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a stored NodeFeature already says what `labels` say: the same keys and
    values but the timestamp's, so a restarted agent, which stamps anew, rewrites nothing."""
    stored = spec_labels(body)
    return stored.keys() == labels.keys() and not labels_changed(stored, labels)


def with_spec_labels(body: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """A copy of a stored NodeFeature with spec.labels replaced, everything else kept."""
    spec = dict(body.get("spec") or {})
    spec["labels"] = dict(labels)
    return {**body, "spec": spec}


def event_type(*, warning: bool) -> str:
    return EVENT_WARNING if warning else EVENT_NORMAL


def shared_event_name(config_map: str, reason: str, message: str) -> str:
    """The one Event every node reports a problem of the shared ConfigMap under: the same
    problem gets the same name on every node, so the nodes bump it rather than each
    creating its own."""
    digest = hashlib.sha256(f"{reason}\n{message}".encode()).hexdigest()[:16]
    return f"{config_map[:200]}.{digest}"
