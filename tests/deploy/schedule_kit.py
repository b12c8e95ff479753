"""Where the scheduler may place a pod of the chart, modelled for the chart tests: the filters
that read the pod's spec against a Node object (NodeUnschedulable, NodeAffinity for
nodeSelector and the required node affinity, TaintToleration), and the tolerations the
DaemonSet controller adds to its pods. Resources, ports and volumes are not modelled: the
nodes of these tests have room for every pod."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Node = dict[str, Any]
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
REFUSING = ("NoSchedule", "NoExecute")  # PreferNoSchedule only steers


def node(
    name: str,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[Mapping[str, str]] = (),
    *,
    unschedulable: bool = False,
) -> Node:
    """A Node object as the API server returns it, with what the filters read."""
    spec: dict[str, Any] = {"taints": [dict(t) for t in taints]}
    if unschedulable:
        spec["unschedulable"] = True
    meta = {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec}


def _matches(expr: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, operator, wanted = expr["key"], expr["operator"], expr.get("values") or []
    if operator == "Exists":
        return key in values
    if operator == "DoesNotExist":
        return key not in values
    if operator == "NotIn":
        return values.get(key) not in wanted
    if key not in values:
        return False
    if operator == "In":
        return values[key] in wanted
    (bound,) = wanted  # Gt, Lt: one integer
    number = int(values[key]) if values[key].lstrip("-").isdigit() else None
    if number is None:
        return False
    return number > int(bound) if operator == "Gt" else number < int(bound)


def selects(affinity: Mapping[str, Any] | None, labels: Mapping[str, str], name: str = "") -> bool:
    """Whether a node with `labels` (and `name`, for matchFields) meets a required node
    affinity: any one term, each with all of its expressions; an empty term matches no node."""
    required = ((affinity or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    fields = {"metadata.name": name}
    return any(
        (term.get("matchExpressions") or term.get("matchFields"))
        and all(_matches(e, labels) for e in term.get("matchExpressions") or ())
        and all(_matches(e, fields) for e in term.get("matchFields") or ())
        for term in required["nodeSelectorTerms"]
    )


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, str]) -> bool:
    """Whether one toleration matches the taint: its effect (none: every effect), its key
    (none, with Exists: every key) and, with Equal (the default operator), its value."""
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint["effect"]:
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint["key"]:
                return True
        elif tol.get("key") == taint["key"] and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def refusal(pod_spec: Mapping[str, Any], node_: Node) -> str | None:
    """Why the scheduler keeps a pod of `pod_spec` off the node, in its words; None: it fits."""
    labels = node_["metadata"].get("labels") or {}
    spec = node_.get("spec") or {}
    tolerations = pod_spec.get("tolerations") or ()
    unschedulable = {"key": UNSCHEDULABLE, "effect": "NoSchedule"}
    if spec.get("unschedulable") and not tolerates(tolerations, unschedulable):
        return "node(s) were unschedulable"
    selector = pod_spec.get("nodeSelector") or {}
    wanted = all(labels.get(k) == v for k, v in selector.items())
    if not (wanted and selects(pod_spec.get("affinity"), labels, node_["metadata"]["name"])):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in spec.get("taints") or ():
        if taint["effect"] in REFUSING and not tolerates(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    return None


def placed(pod_spec: Mapping[str, Any], nodes: Iterable[Node]) -> list[str]:
    """The names of the nodes where a pod of `pod_spec` may run."""
    return [n["metadata"]["name"] for n in nodes if refusal(pod_spec, n) is None]


# The DaemonSet controller adds these to every pod it creates (network-unavailable only to
# hostNetwork pods), so its pods stay on nodes under pressure, not ready or cordoned.
_DAEMON_TOLERATIONS = (
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    (UNSCHEDULABLE, "NoSchedule"),
)


def daemon_pod(template_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of the pod the DaemonSet controller creates from its template's spec."""
    added = [*_DAEMON_TOLERATIONS]
    if template_spec.get("hostNetwork"):
        added.append(("node.kubernetes.io/network-unavailable", "NoSchedule"))
    tolerations = [*(template_spec.get("tolerations") or ())]
    tolerations += [{"key": k, "operator": "Exists", "effect": e} for k, e in added]
    return {**template_spec, "tolerations": tolerations}
