"""The admission policy's CEL, evaluated on pod and workload fixtures: what is refused, what is
let through, and the message. Kubernetes' Quantity functions are a faithful stand-in
(k8s_cel); the stand-in is checked against the quantity grammar first."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from gpuslice.core.admission import DENY, WARN, params_data, policy_spec

from .k8s_cel import CelError, admit, evaluate, parse_quantity

SHARED, GPU, MIG = "nvidia.com/gpu.shared", "nvidia.com/gpu", "nvidia.com/mig-1g.5gb"
SPEC = policy_spec()
DENY_PARAMS = {"data": params_data([SHARED, MIG], DENY)}
WARN_PARAMS = {"data": params_data([GPU], WARN)}


def ctr(name: str, limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "cuda"}
    if limits is not None:
        out["resources"] = {"limits": limits}
    out.update(extra)
    return out


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": list(containers), **spec}}


def denied(obj: dict[str, Any], params: dict[str, Any] = DENY_PARAMS, **kw: Any) -> str:
    verdict = admit(SPEC, obj, params, **kw)
    assert verdict.matched
    assert not verdict.allowed, "expected the request to be refused"
    return verdict.message


def allowed(obj: dict[str, Any], params: dict[str, Any] = DENY_PARAMS, **kw: Any) -> bool:
    return admit(SPEC, obj, params, **kw).allowed


# --- the Quantity stand-in ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2),
        ("+2", 2),
        ("-1", -1),
        ("2k", 2000),
        ("1Ki", 1024),
        ("3Mi", 3 * 1024**2),
        ("500m", Fraction(1, 2)),
        ("1500m", Fraction(3, 2)),
        ("1e3", 1000),
        ("1E-1", Fraction(1, 10)),
        ("1E", 10**18),
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("1.", 1),
        ("100u", Fraction(1, 10**4)),
    ],
)
def test_the_quantity_stand_in_reads_what_kubernetes_parses(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "2K", "1.2.3", "k", "1ki", "1 ", "two", "1e", "0x10"])
def test_the_quantity_stand_in_refuses_what_kubernetes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="regular expression"):
        parse_quantity(text)


def test_the_stand_in_methods_refuse_a_plain_string() -> None:
    """An expression comparing strings without quantity() would fail in Kubernetes too."""
    assert evaluate("quantity('2k').isGreaterThan(quantity('1'))", {}) is True
    assert evaluate("quantity('1').compareTo(quantity('1000m'))", {}) == 0
    with pytest.raises(CelError, match="not a quantity"):
        evaluate("'2'.isGreaterThan(quantity('1'))", {})
    with pytest.raises(CelError, match="regular expression"):
        evaluate("quantity('2K')", {})


# --- what is refused ----------------------------------------------------------------------


@pytest.mark.parametrize("amount", ["2", "2k", "1Ki", "1e3", "1500m", 2, 7])
def test_more_than_one_of_a_capped_resource_is_refused(amount: Any) -> None:
    message = denied(pod(ctr("train", {SHARED: amount})))
    assert message.startswith(f"container train asks for {amount} of {SHARED}, which is shared")


@pytest.mark.parametrize("amount", ["1", "+1", "1000m", "500m", "0", 1])
def test_one_or_less_is_allowed(amount: Any) -> None:
    """500m is below 1; the API server refuses a fraction of an extended resource before
    admission policies run, so it never reaches the policy."""
    assert allowed(pod(ctr("train", {SHARED: amount})))


def test_the_message_says_what_to_ask_for_instead() -> None:
    assert denied(pod(ctr("train", {SHARED: "2"}))) == (
        f"container train asks for 2 of {SHARED}, which is shared with "
        "failRequestsGreaterThanOne: ask for 1; for more GPU, ask for a resource that is not "
        "shared"
    )


def test_a_request_above_one_is_refused_as_a_limit_is() -> None:
    requests = ctr("train", resources={"requests": {SHARED: "2"}})
    assert "asks for 2 of" in denied(pod(requests))
    both = ctr("train", resources={"requests": {SHARED: "1"}, "limits": {SHARED: "3"}})
    assert "asks for 3 of" in denied(pod(both))
    assert allowed(pod(ctr("t", resources={"requests": {SHARED: "1"}, "limits": {SHARED: "1"}})))


def test_init_containers_are_checked_and_named() -> None:
    obj = pod(ctr("main", {SHARED: "1"}), initContainers=[ctr("warmup", {MIG: "2"})])
    assert denied(obj).startswith(f"container warmup asks for 2 of {MIG}")
    sidecar = ctr("proxy", {SHARED: "3"}, restartPolicy="Always")
    assert "container proxy asks for 3" in denied(pod(ctr("main"), initContainers=[sidecar]))


def test_ephemeral_containers_are_not_read() -> None:
    """The API server refuses resources on an ephemeral container ("cannot be set for an
    Ephemeral Container"), so only containers and init containers can ask for a GPU."""
    debug = ctr("debug", {SHARED: "2"})
    assert allowed(pod(ctr("main", {SHARED: "1"}), ephemeralContainers=[debug]))


def test_every_offending_container_and_resource_is_named() -> None:
    obj = pod(
        ctr("a", {SHARED: "2"}),
        ctr("b", {"cpu": "4", SHARED: "1"}),
        ctr("c", {SHARED: "4", MIG: "2k"}),
    )
    assert denied(obj).startswith(
        f"container a asks for 2 of {SHARED}; container c asks for 4 of {SHARED} and 2k of "
        f"{MIG}, which are shared"
    )


@pytest.mark.parametrize(
    "obj",
    [
        pod(ctr("cpu-only")),
        pod(ctr("cpu", {"cpu": "8", "memory": "2Gi"})),
        pod(ctr("whole", {GPU: "4"})),
        pod(ctr("other", {"example.com/fpga": "2"})),
        pod(ctr("a", {SHARED: "1"}), ctr("b", {SHARED: "1"}), ctr("c", {GPU: "8"})),
    ],
    ids=["no-resources", "cpu-memory", "uncapped-gpu", "other-vendor", "several-fine"],
)
def test_pods_without_a_capped_resource_above_one_are_allowed(obj: dict[str, Any]) -> None:
    assert allowed(obj)


def test_params_without_names_allow_everything() -> None:
    obj = pod(ctr("train", {SHARED: "8"}))
    assert allowed(obj, {"data": params_data([], DENY)})
    assert allowed(obj, {"metadata": {"name": "empty"}})  # a ConfigMap with no data at all
    assert not allowed(obj, {"data": {"resources": f" {SHARED} , ", "nodes": "every"}})


def test_the_warn_binding_names_the_nodes_it_concerns() -> None:
    message = denied(pod(ctr("train", {GPU: "2"})), WARN_PARAMS)
    assert message == (
        f"container train asks for 2 of {GPU}, which is shared with failRequestsGreaterThanOne "
        "on some nodes, where the kubelet refuses the pod (UnexpectedAdmissionError): ask for "
        "1, or select nodes that do not share it"
    )
    assert allowed(pod(ctr("train", {SHARED: "2"})), WARN_PARAMS)


# --- workloads and updates ----------------------------------------------------------------


def template(amount: str) -> dict[str, Any]:
    return {"spec": {"containers": [ctr("train", {SHARED: amount})]}}


WORKLOADS = {
    "Deployment": ("apps/v1", lambda t: {"replicas": 3, "template": t}),
    "StatefulSet": ("apps/v1", lambda t: {"serviceName": "s", "template": t}),
    "DaemonSet": ("apps/v1", lambda t: {"template": t}),
    "ReplicaSet": ("apps/v1", lambda t: {"template": t}),
    "ReplicationController": ("v1", lambda t: {"template": t}),
    "Job": ("batch/v1", lambda t: {"template": t}),
    "CronJob": (
        "batch/v1",
        lambda t: {"schedule": "@daily", "jobTemplate": {"spec": {"template": t}}},
    ),
}


@pytest.mark.parametrize("kind", WORKLOADS)
def test_workloads_are_refused_at_apply_by_their_pod_template(kind: str) -> None:
    api_version, spec = WORKLOADS[kind]
    obj = {"apiVersion": api_version, "kind": kind, "spec": spec(template("2"))}
    assert denied(obj).startswith(f"container train asks for 2 of {SHARED}")
    assert allowed({**obj, "spec": spec(template("1"))})


def test_the_policy_matches_every_kind_it_reads() -> None:
    rules = SPEC["matchConstraints"]["resourceRules"]
    matched = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert matched == {
        ("", "pods"),
        ("", "replicationcontrollers"),
        *(("apps", r) for r in ("deployments", "replicasets", "statefulsets", "daemonsets")),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
    }


def test_an_update_is_checked_only_when_the_spec_changes() -> None:
    """A finalizer or label edit of an object made before the policy is never blocked."""
    old = {**pod(ctr("train", {SHARED: "2"})), "metadata": {"labels": {"a": "1"}}}
    relabelled = {**old, "metadata": {"labels": {"a": "2"}}}
    verdict = admit(SPEC, relabelled, DENY_PARAMS, old=old)
    assert not verdict.matched
    assert verdict.allowed
    changed = {**old, "spec": pod(ctr("train", {SHARED: "3"}))["spec"]}
    assert "asks for 3 of" in denied(changed, old=old)
